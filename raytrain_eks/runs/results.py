"""A finished run's results, copied out of its storage and judged: records, the exported model,
the report and the verdict. Used by ``raytrain-eks submit`` (both backends) and ``make demo``.

What is copied: ``run.json``, ``metrics.jsonl``, the logs and NCCL logs, the TensorBoard event
files (``<run>/tensorboard/``: ``tensorboard --logdir`` over the copies shows runs side by side), and the exported
Hugging Face model (``<run>/hf/``: weights, config and tokenizer, so ``from_pretrained`` loads
the folder) and a LoRA run's adapter (``<run>/hf-adapter/``, for ``PeftModel.from_pretrained``). The checkpoint shards stay in storage: they are for resuming, not for using.

A netcheck run's results (:func:`finish_netcheck`): its table, its plot (``netcheck.png`` beside
``netcheck.json``: bus bandwidth by message size, one line per scope, collective and mode) and
its verdict's exit code.

Any run storage (training/storage/__init__.py): the bucket through boto3's ``client``, a shared or
local file system by its path (readable where it is mounted; ``client`` is then unused).
"""
from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from training.contract import ADAPTER_SUFFIX, NETCHECK_NAME, TENSORBOARD_DIR
from training.storage import RunStorage

RECORD_SUFFIXES = (".json", ".jsonl", ".md", ".txt", ".log")
MODEL_DIR = "hf"
"""The exported model's folder inside a run directory (training/checkpointing/export.py: export_on_workers writes ``<run>/hf``)."""
MODEL_DIRS = (MODEL_DIR, MODEL_DIR + ADAPTER_SUFFIX)
"""Copied whole: the export and a LoRA run's peft adapter beside it (``<run>/hf-adapter``, its weights included)."""


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
    if relative.startswith((*(f"{d}/" for d in MODEL_DIRS), f"{TENSORBOARD_DIR}/")):
        return True
    name = Path(relative).name
    return relative.endswith(RECORD_SUFFIXES) and not relative.startswith("checkpoint") and "__" not in name


def _files(run_uri: str) -> list[str]:
    """Every file under a run on a file system, relative to it, ``/``-separated. A symbolic link
    is no file of the run: a job may leave one pointing at anything the operator can read."""
    base = Path(RunStorage(run_uri).path)
    return sorted(p.relative_to(base).as_posix() for p in base.rglob("*")
                  if p.is_file() and not p.is_symlink()) if base.is_dir() else []


def unsafe_relative(relative: str) -> str:
    """Why a stored name (a key below the run's prefix) cannot be a file of the run folder, or "".

    Nothing read back is trusted by its name: any pod of the run may write any key below its
    prefix, and S3 keeps a key as given (an object key is any UTF-8 string, the Amazon S3 User
    Guide, "Creating object key names"). Refused: an empty name, an absolute one (``//`` after
    the prefix), empty, ``.`` or ``..`` segments, backslashes (a separator on Windows) and
    control characters (NUL ends a path in the C library)."""
    if not relative:
        return "empty name"
    if relative.startswith("/"):
        return "absolute path"
    if "\\" in relative:
        return "backslash"
    if any(ord(c) < 32 for c in relative):
        return "control character"
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts[:-1]) or parts[-1] in (".", ".."):
        return "empty, '.' or '..' segment"
    return ""


def safe_target(dest: Path, relative: str) -> Path | None:
    """``dest/relative`` when it stays inside ``dest`` with no symbolic link on the way (a
    results folder reused by ``--out`` may hold one), else None."""
    if unsafe_relative(relative):
        return None
    root = dest.resolve()
    target = root.joinpath(*PurePosixPath(relative).parts)
    if not target.is_relative_to(root):
        return None
    probe = root
    for part in PurePosixPath(relative).parts:
        probe = probe / part
        if probe.is_symlink():
            return None
    return target


def refuse_line(refused: list[str], run_uri: str) -> str:
    """The one line that names what the copy left in storage, and why."""
    shown = ", ".join(f"{r!r} ({unsafe_relative(r) or 'through a symbolic link'})" for r in refused[:3])
    more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
    return (f"results: refused {len(refused)} key(s) of {run_uri} that would land outside the run folder or "
            f"through a link: {shown}{more} (a job wrote them; nothing was written for them)")


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
    """Copy the run's records and exported model into ``dest``; returns the relative paths copied.
    A name that would land outside ``dest`` or through a link is refused (:func:`safe_target`),
    all of them in one line on stderr."""
    dest.mkdir(parents=True, exist_ok=True)
    copied, refused = [], []
    on_s3 = RunStorage(run_uri).kind == "s3"
    bucket, prefix = split_uri(run_uri)
    base = prefix.rstrip("/") + "/"
    names = [key[len(base):] for key in list_keys(client, run_uri)] if on_s3 else _files(run_uri)
    for relative in names:
        if not wanted(relative) and not unsafe_relative(relative):
            continue
        target = safe_target(dest, relative)
        if target is None:
            refused.append(relative)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if on_s3:
            client.download_file(bucket, base + relative, str(target))
        else:
            shutil.copyfile(Path(RunStorage(run_uri).path, relative), target, follow_symlinks=False)
        copied.append(relative)
    if refused:
        print(refuse_line(refused, run_uri), file=sys.stderr)
    return copied


def sha256_b64(local: Path) -> str:
    """The file's SHA-256 as S3 writes ``ChecksumSHA256``: base64 of the raw digest."""
    digest = hashlib.sha256()
    with open(local, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return base64.b64encode(digest.digest()).decode()


MULTIPART_FROM = 256 << 20
"""Files this large or larger go up in parts: one PutObject stops at 5 GB (Amazon S3 User
Guide, "Uploading and copying objects using multipart upload": 5 GiB per part and per single
put, up to 10,000 parts), and a part that fails is retried alone."""
PART_BYTES = 64 << 20
"""A part's size (S3: at least 5 MiB except the last); larger where 10,000 parts would not hold
the file (inputs stop at 64 GiB, raytrain_eks/runs/inputs.py: 1,024 parts)."""
MAX_PARTS = 10_000


def _part_bytes(size: int) -> int:
    return max(PART_BYTES, -(-size // MAX_PARTS))


def _parts(local: Path):
    """(number, bytes) of each part, in order."""
    size = _part_bytes(local.stat().st_size)
    with open(local, "rb") as f:
        for number, block in enumerate(iter(lambda: f.read(size), b""), start=1):
            yield number, block


def stored_sha256(local: Path) -> str:
    """The ``ChecksumSHA256`` S3 keeps for ``local`` as :func:`put_once` writes it: the file's
    SHA-256 for a single put; for a multipart upload S3's COMPOSITE checksum, the SHA-256 of the
    parts' raw SHA-256 digests joined, then ``-<parts>`` (Amazon S3 User Guide, "Checking object
    integrity": "Using part-level checksums for multipart uploads"; SHA-256 has no full-object
    type). Both depend only on the bytes and :data:`MULTIPART_FROM`/:data:`PART_BYTES`."""
    if local.stat().st_size < MULTIPART_FROM:
        return sha256_b64(local)
    digests = [hashlib.sha256(block).digest() for _, block in _parts(local)]
    return f"{base64.b64encode(hashlib.sha256(b''.join(digests)).digest()).decode()}-{len(digests)}"


def put_once(client: Any, local: Path, bucket: str, key: str) -> None:
    """Write ``local`` at ``key`` only if no object is there (``If-None-Match: *``: S3 answers 412
    PreconditionFailed otherwise), with its SHA-256 for S3 to check and keep. The bucket policy
    (infra/stacks/storage.py) denies a put on code/ and inputs without that header, so
    nobody's put, ours included, replaces an archive that runs execute.

    From :data:`MULTIPART_FROM` up, a multipart upload: every part carries its SHA-256 (S3 checks
    each), and the condition goes on CompleteMultipartUpload, the request that makes the object
    (its ``IfNoneMatch``, botocore's S3 model 2006-03-01: header ``If-None-Match``, "Uploads the
    object only if the object key name does not already exist"; CreateMultipartUpload and
    UploadPart take no condition). An object made meanwhile wins: 412, and the parts are
    aborted."""
    if local.stat().st_size < MULTIPART_FROM:
        with open(local, "rb") as body:
            client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*",
                              ChecksumAlgorithm="SHA256", ChecksumSHA256=sha256_b64(local))
        return
    upload = client.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256")["UploadId"]
    try:
        parts = []
        for number, block in _parts(local):
            digest = base64.b64encode(hashlib.sha256(block).digest()).decode()
            etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=block,
                                      ChecksumAlgorithm="SHA256", ChecksumSHA256=digest)["ETag"]
            parts.append({"ETag": etag, "PartNumber": number, "ChecksumSHA256": digest})
        client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, IfNoneMatch="*",
                                         MultipartUpload={"Parts": parts})
    except BaseException:
        try:  # the bucket's lifecycle rule aborts what is left here anyway
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
        except Exception:  # noqa: BLE001 - the upload's own error is the one to report
            pass
        raise


def upload_if_missing(client: Any, local: Path, uri: str, *, create_bucket: bool = False) -> bool:
    """Upload ``local`` to ``uri`` unless an object is there already; returns whether it uploaded.

    The name is a content hash anyone who submits can compute, so an object of that name is
    trusted only when S3's stored SHA-256 (``HeadObject`` with ``ChecksumMode=ENABLED``) equals
    the local file's; otherwise a one-line refusal naming the key. Pods read these keys without
    hashing them again (Ray's working_dir download), so this check and the write-once policy are
    what stand between another submitter and the code a run executes."""
    from botocore.exceptions import ClientError

    from charts import ChartError

    bucket, key = split_uri(uri)
    if create_bucket:
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
    try:
        head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
            raise
    else:
        # A multipart upload's is S3's COMPOSITE checksum, written "<b64>-<parts>" (moto 5.2.5's
        # HeadObject leaves the suffix off and sends no ChecksumType; its GetObject adds both), a
        # single put's the file's: the digest must be one of the two this file gives.
        got = (head.get("ChecksumSHA256") or "").split("-")[0]
        want = stored_sha256(local)
        if got not in {want.split("-")[0], sha256_b64(local) if "-" in want else want}:
            raise ChartError(f"upload: s3://{bucket}/{key} already holds other bytes (stored SHA-256 "
                             f"{head.get('ChecksumSHA256') or 'none'}, this file's {want}): refusing to run "
                             "it; ask the bucket's owner who wrote it")
        return False
    put_once(client, local, bucket, key)
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


PLOT_NAME = "netcheck.png"


def plot(record: dict[str, Any], out: Path) -> Path:
    """busbw (GB/s) against message size (log2), one panel per collective."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from training.netcheck.worker import COLLECTIVES

    fig, axes = plt.subplots(1, len(COLLECTIVES), figsize=(5 * len(COLLECTIVES), 4), dpi=100, squeeze=False)
    link = (record["verdict"].get("figures") or {}).get("link_gbs")
    for ax, collective in zip(axes[0], COLLECTIVES):
        for mode, result in record["modes"].items():
            scopes = sorted({r["scope"] for r in result["rows"]})
            for scope in scopes:
                points = sorted((r["bytes"], r["busbw_gbs"]) for r in result["rows"]
                                if r["scope"] == scope and r["collective"] == collective)
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, ys, marker="o", markersize=3, linestyle="-" if mode == "nccl" else "--",
                            label=f"{scope} {mode} ({result['evidence'].get('transport')})")
        if link:
            ax.axhline(link, color="grey", linewidth=0.8, label=f"link {link:g} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(collective)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"netcheck: {record['verdict']['verdict']}")
    fig.tight_layout()
    target = out / PLOT_NAME
    fig.savefig(target)
    plt.close(fig)
    return target


def finish_netcheck(out_dir: Path, say=print) -> int:
    """Print the table, draw the plot, say the verdict; returns its exit code."""
    from training.netcheck import headline, table

    record = json.loads((out_dir / NETCHECK_NAME).read_text(encoding="utf-8"))
    say(table(record))
    say(f"    netcheck:  {out_dir / NETCHECK_NAME}")
    say(f"    plot:      {plot(record, out_dir)}")
    say(f"    verdict:   {headline(record['verdict'])}")
    return int(record["verdict"]["exit_code"])
