"""A finished run's results, copied out of its storage and judged: records, the exported model,
the report and the verdict. Used by ``raytrain-eks submit`` (both backends) and ``make demo``.

What is copied: ``run.json``, ``metrics.jsonl``, the logs and NCCL logs, the TensorBoard event
files (``<run>/tensorboard/``: ``tensorboard --logdir`` over the copies shows runs side by side), and the exported
Hugging Face model (``<run>/hf/``: weights, config and tokenizer, so ``from_pretrained`` loads
the folder). The checkpoint shards stay in storage: they are for resuming, not for using.

Any run storage (training/storage/__init__.py): the bucket through boto3's ``client``, a shared or
local file system by its path (readable where it is mounted; ``client`` is then unused).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from training.contract import TENSORBOARD_DIR
from training.storage import RunStorage

RECORD_SUFFIXES = (".json", ".jsonl", ".md", ".txt", ".log")
MODEL_DIR = "hf"
"""The exported model's folder inside a run directory (training/checkpointing/export.py: export_on_workers writes ``<run>/hf``)."""


def s3_client(client_env: dict[str, str] | None = None, *, region: str | None = None) -> Any:
    """boto3's S3 client: ``client_env`` (a local server's endpoint and keys), or the default
    credential chain in ``region`` (the environment's: the bucket lives there)."""
    import boto3

    if not client_env:
        return boto3.client("s3", region_name=region)
    return boto3.client("s3", endpoint_url=client_env["AWS_ENDPOINT_URL"], region_name=client_env["AWS_DEFAULT_REGION"],
                        aws_access_key_id=client_env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=client_env["AWS_SECRET_ACCESS_KEY"])


def split_uri(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def list_keys(client: Any, uri: str) -> list[str]:
    bucket, prefix = split_uri(uri)
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def wanted(relative: str) -> bool:
    """A run directory's file worth copying out: records and logs, the event files, and the whole exported model."""
    if relative.endswith("/"):  # a folder marker (pyarrow's S3 create_dir writes one): no file
        return False
    if relative.startswith((f"{MODEL_DIR}/", f"{TENSORBOARD_DIR}/")):
        return True
    name = Path(relative).name
    return relative.endswith(RECORD_SUFFIXES) and not relative.startswith("checkpoint") and "__" not in name


def _files(run_uri: str) -> list[str]:
    """Every file under a run on a file system, relative to it, ``/``-separated."""
    base = Path(RunStorage(run_uri).path)
    return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()) if base.is_dir() else []


def read_file(client: Any, uri: str) -> bytes:
    """One stored file's bytes (a missing one raises, as boto3's ``get_object`` or ``open`` does)."""
    storage = RunStorage(uri)
    if storage.kind != "s3":
        return Path(storage.path).read_bytes()
    bucket, key = split_uri(uri)
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


def write_file(client: Any, uri: str, body: bytes) -> None:
    """Write one file to a run storage (an object, or a file of the mounted file system)."""
    storage = RunStorage(uri)
    if storage.kind != "s3":
        Path(storage.path).parent.mkdir(parents=True, exist_ok=True)
        Path(storage.path).write_bytes(body)
        return
    bucket, key = split_uri(uri)
    client.put_object(Bucket=bucket, Key=key, Body=body)


def download_run(client: Any, run_uri: str, dest: Path) -> list[str]:
    """Copy the run's records and exported model into ``dest``; returns the relative paths copied."""
    if RunStorage(run_uri).kind != "s3":
        copied = [relative for relative in _files(run_uri) if wanted(relative)]
        for relative in copied:
            (dest / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(RunStorage(run_uri).path, relative), dest / relative)
        return copied
    bucket, prefix = split_uri(run_uri)
    base = prefix.rstrip("/") + "/"
    copied = []
    for key in list_keys(client, run_uri):
        relative = key[len(base):]
        if not wanted(relative):
            continue
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, key, str(target))
        copied.append(relative)
    return copied


def upload_if_missing(client: Any, local: Path, uri: str, *, create_bucket: bool = False) -> bool:
    """Upload ``local`` to ``uri`` unless an object is there already (the name is its content's
    hash, so an object of that name IS this file); returns whether it uploaded."""
    from botocore.exceptions import ClientError

    bucket, key = split_uri(uri)
    if create_bucket:
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
    try:
        client.head_object(Bucket=bucket, Key=key)
        return False
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
            raise
    client.upload_file(str(local), bucket, key)
    return True


def run_exists(client: Any, run_uri: str) -> bool:
    """Whether storage already holds anything of this run (a record, metrics or a checkpoint)."""
    if RunStorage(run_uri).kind != "s3":
        return bool(_files(run_uri))
    bucket, prefix = split_uri(run_uri)
    page = client.list_objects_v2(Bucket=bucket, Prefix=prefix.rstrip("/") + "/", MaxKeys=1)
    return bool(page.get("KeyCount") or page.get("Contents"))


def finish(out_dir: Path, say=print) -> int:
    """Render the report of the run copied into ``out_dir``, print where everything is and the
    verdict; returns the verdict's exit code (training/verdict.py)."""
    from raytrain_eks.runs.report import eval_before_after, load_run, render_report
    from training.verdict import exit_code, headline, of_record

    report = render_report([str(out_dir)], out_dir / "report")
    run = load_run(str(out_dir))
    before, after = eval_before_after(run)
    say(f"    run.json:  {out_dir / 'run.json'}  (status {run.record.get('status')})")
    say(f"    report:    {report}  (+ PNG plots beside it)")
    if (out_dir / MODEL_DIR / "config.json").is_file():
        say(f"    model:     {out_dir / MODEL_DIR}  (transformers: AutoModelForCausalLM.from_pretrained(...))")
    if before is not None and after is not None:
        say(f"    held-out loss before {before:.4f} -> after {after:.4f}")
    if run.resumes:
        say(f"    resumed:   logged again from step {', '.join(map(str, run.resumes))} (the report shows each step's last write)")
    verdict = of_record(run.record)
    say(f"    verdict:   {headline(verdict)}")
    return exit_code(verdict)
