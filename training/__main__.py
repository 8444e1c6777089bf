"""``python -m training --config FILE [--set section.key=value ...]``: the job's entry point.

Everything is validated BEFORE a worker starts: the job config's own rules (training/config.py)
and then what needs the model's config.json (``seq_len`` within ``max_position_embeddings``).
A user error is one line on stderr and exit code 2; a failed run exits 1.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Fine-tune a causal LM with FSDP2 under Ray Train, as described by a job config.")
    parser.add_argument("--config", required=True, help="job config (TOML), e.g. jobs/local-demo.toml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one field, e.g. --set train.max_steps=20 (repeatable)")
    parser.add_argument("--check", action="store_true", help="validate the job config and exit")
    return parser.parse_args(argv)


def validate_job(config_path: str, overrides: list[str]):
    """The job config, checked against the model's own config where it can be read."""
    from training.config import load_job_config
    from training.model import ModelConfigError, check_seq_len, read_model_config

    job = load_job_config(config_path, overrides)
    tokenizer = job.model.tokenizer
    if tokenizer and "://" not in tokenizer and not Path(tokenizer).is_dir():
        raise ModelConfigError(f"{job.source}: model.tokenizer: {tokenizer!r} is not a directory "
                               "(give a tokenizer directory, an s3:// prefix, or leave it empty)")
    model_config = read_model_config(job.model.path) if job.model.path else dict(job.model.config)
    if model_config:
        check_seq_len(job.train.seq_len, model_config, source=job.source)
    return job


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from training.config import JobConfigError
    from training.model import ModelConfigError

    try:
        job = validate_job(args.config, args.overrides)
    except (JobConfigError, ModelConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{job.source}: ok ({job.parallel.num_workers} workers, {job.parallel.strategy}, "
              f"{job.train.max_steps} steps of {job.tokens_per_step} tokens)")
        return 0
    from training.launch import run

    return run(job, argv=[sys.executable, "-m", "training", *argv])


if __name__ == "__main__":
    sys.exit(main())
