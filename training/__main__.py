"""``python -m training --config FILE [--set section.key=value ...]``: the job's entry point.

Everything is validated BEFORE a worker starts: the job config's own rules (training/config.py),
what needs the model's config.json (``seq_len`` within ``max_position_embeddings``) and the data
it can reach (training/data/check.py: every record of local files, the head of S3 objects).
A user error is one line on stderr and exit code 2; a failed run exits 1.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

PLACEHOLDER = "{bucket}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Fine-tune a causal LM with FSDP2 under Ray Train, as described by a job config.")
    parser.add_argument("--config", required=True, help="job config (TOML), e.g. jobs/local.toml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one field, e.g. --set train.max_steps=20 (repeatable)")
    parser.add_argument("--check", action="store_true",
                        help="validate the job config, the model's config and the data it can reach, and exit")
    return parser.parse_args(argv)


def check_model(job) -> str:
    """The model's own config against the job (seq_len); returns a one-line note of what was read."""
    from training.model_config import ModelConfigError, check_seq_len, read_model_config

    tokenizer = job.model.tokenizer
    if tokenizer and "://" not in tokenizer and not Path(tokenizer).is_dir():
        raise ModelConfigError(f"{job.source}: model.tokenizer: {tokenizer!r} is not a directory "
                               "(give a tokenizer directory, an s3:// prefix, or leave it empty)")
    if not job.model.path:
        return "model from model.config"
    if PLACEHOLDER in job.model.path:
        return f"{job.model.path} not read: {PLACEHOLDER} is filled in from environment.toml"
    try:
        model_config = read_model_config(job.model.path, job.source)
    except ModelConfigError as err:
        if job.model.path.startswith("s3://") and "cannot read" in str(err):
            return f"{job.model.path} not read: S3 not reachable from here"
        raise
    if model_config is None:
        return f"{job.model.path}: a hub id (checked by the workers once downloaded)"
    check_seq_len(job.train.seq_len, model_config, source=job.source)
    return f"{job.model.path}/config.json read"


def validate_job(config_path: str, overrides: list[str]):
    """The job config, checked against the model's own config where it can be read."""
    from training.config import load_job_config

    job = load_job_config(config_path, overrides)
    check_model(job)
    return job


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from training.config import JobConfigError, load_job_config
    from training.data.check import check_data
    from training.data.records import DataError

    try:
        job = load_job_config(args.config, args.overrides)
        model_note = check_model(job)
        data = check_data(job)
    except (JobConfigError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{job.source}: ok ({job.parallel.num_workers} workers, {job.parallel.strategy}, "
              f"{job.train.max_steps} steps of {job.tokens_per_step} tokens)")
        print(f"  model  {model_note}")
        print(f"  data   {data.summary}")
        return 0
    from training.launch import run

    return run(job, argv=[sys.executable, "-m", "training", *argv])


if __name__ == "__main__":
    sys.exit(main())
