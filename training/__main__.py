"""``python -m training --config FILE [--set section.key=value ...] [--workers N --workers-per-node G]``:
the job's entry point. ``--workers``/``--workers-per-node`` carry a GPU job's size as the charts
decided it from the spec (:class:`training.config_sections.WorldSize`); they win over the file and ``--set``.

Everything is validated BEFORE a worker starts: the job config's own rules (training/config.py),
what needs the model's config.json (``seq_len`` within ``max_position_embeddings``) and the data
it can reach (training/data/check.py: every record of local files, the head of S3 objects).
A user error is one line on stderr and exit code 2; a failed run exits 1.
"""
from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Fine-tune a causal LM with FSDP2 under Ray Train, as described by a job config.")
    parser.add_argument("--config", required=True, help="job config (TOML), e.g. jobs/local.toml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one field, e.g. --set train.max_steps=20 (repeatable)")
    parser.add_argument("--check", action="store_true",
                        help="validate the job config, the model's config and the data it can reach, and exit")
    from training.config_sections import WorldSize

    parser.add_argument(WorldSize.WORKERS_FLAG, dest="workers", type=int, metavar="N",
                        help="the job's world size (Ray Train workers, one GPU each), as the charts size it")
    parser.add_argument(WorldSize.PER_NODE_FLAG, dest="workers_per_node", type=int, metavar="G",
                        help=f"workers per worker pod (with {WorldSize.WORKERS_FLAG})")
    args = parser.parse_args(argv)
    if (args.workers is None) != (args.workers_per_node is None):
        parser.error(f"{WorldSize.WORKERS_FLAG} and {WorldSize.PER_NODE_FLAG} go together")
    args.world = None if args.workers is None else WorldSize(num_workers=args.workers,
                                                             workers_per_node=args.workers_per_node)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from training.config import JobConfigError, load_job_config
    from training.data.check import check_data
    from training.data.records import DataError
    from training.model_config import check_model

    try:
        job = load_job_config(args.config, args.overrides, args.world)
        if not (job.parallel.sized or args.check):
            raise JobConfigError(f"{job.source}: parallel.num_workers: 0 leaves a GPU job's size to its node group: "
                                 "run it with raytrain-eks submit (the charts size it from environment.toml) "
                                 "or pass --workers N --workers-per-node G")
        model_note = check_model(job)
        data = check_data(job)
    except (JobConfigError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{job.source}: ok ({_workers(job)}, {job.parallel.strategy}, "
              f"{_count(job.train.max_steps, 'step')} of {job.tokens_per_step} tokens)")
        if not job.parallel.sized:
            print("  size   not checked here: a GPU job is sized to its node group by the charts "
                  "(`raytrain-eks preflight` checks it at that size)")
        print(f"  model  {model_note}")
        print(f"  data   {data.summary}")
        return 0
    from training.launch import run
    from training import netcheck

    if job.kind == "netcheck":
        return netcheck.run(job)
    return run(job, argv=[sys.executable, "-m", "training", *argv],
               before_fit=netcheck.before_training if job.netcheck.run_first else None)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _workers(job) -> str:
    """The world size as the file gives it; a GPU job's comes from its node group."""
    if not job.parallel.sized:
        return "GPU workers: one per GPU of its node group"
    return _count(job.parallel.num_workers, "worker")


if __name__ == "__main__":
    sys.exit(main())
