"""What ran, read on a training worker: versions, per-rank placement, inputs' fingerprints (run.json's
``versions``, ``ranks``, ``inputs``, ``nccl_logs``, returned by rank 0 to the driver's record).

The driver of a RayJob runs on the head pod (a CPU node, ``NVIDIA_VISIBLE_DEVICES=void``): GPU,
driver, CUDA and NCCL read there are empty or wrong. So rank 0's worker reads the versions
(:func:`collect_versions`) and every rank its own placement (:func:`rank_facts`), gathered to
rank 0 by one collective; rank 0 returns them to the driver, which writes them into run.json.

A fact that cannot be read is recorded as absent WITH the reason (:func:`absent`), never
guessed: ``{"absent": "no NVIDIA driver on this node (/proc/driver/nvidia/version missing)"}``.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

from training import contract
from training.run_logs import nccl_log_uri
from training.storage.files import is_s3, object_versions

PACKAGES = ("torch", "ray", "transformers", "accelerate", "safetensors", "tokenizers", "pyarrow", "numpy",
            "boto3", "nvidia-nccl-cu12", "nvidia-nccl-cu13")
"""Python packages of interest (installed metadata only; nothing is imported for them)."""
NCCL_ENV_PREFIXES = ("NCCL_", "FI_")
OFI_NCCL_PATHS = ("/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so", "/opt/amazon/ofi-nccl/lib64/libnccl-net-ofi.so",
                  "/opt/aws-ofi-nccl/lib/libnccl-net.so", "/opt/amazon/efa/lib/libnccl-net-ofi.so")
EFA_INSTALLED = "/opt/amazon/efa_installed_packages"
NVIDIA_PROC = "/proc/driver/nvidia/version"


def absent(reason: str) -> dict[str, str]:
    return {"absent": reason}


def _package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _nvidia_driver() -> Any:
    try:
        text = Path(NVIDIA_PROC).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for token in text.split():
        if token.count(".") >= 1 and token.replace(".", "").isdigit():
            return token  # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  ..."
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return absent(f"no NVIDIA driver on this node ({NVIDIA_PROC} missing, no nvidia-smi)")


def _efa_installer() -> Any:
    try:
        text = Path(EFA_INSTALLED).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return absent(f"{EFA_INSTALLED} missing (no EFA installer in this image)")
    for line in text.splitlines():
        if "installer version" in line.lower():
            return line.split(":", 1)[-1].strip()
    return absent(f"{EFA_INSTALLED} names no installer version")


def _aws_ofi_nccl() -> Any:
    for path in OFI_NCCL_PATHS:
        if os.path.exists(path):
            # The library carries no version string we can read without loading it; NCCL's own
            # log names it ("NET/OFI Initializing aws-ofi-nccl X"): the record fills it from there.
            return {"path": path, "version_from": "NCCL log (transport evidence)"}
    return absent("aws-ofi-nccl plugin not installed (" + ", ".join(OFI_NCCL_PATHS[:2]) + " missing)")


def collect_versions(on_gpu: bool) -> dict[str, Any]:
    """Versions of everything that shapes a result, read in THIS process (a training worker)."""
    versions: dict[str, Any] = {
        "read_on": f"rank-0 worker on {socket.gethostname()}",
        "python": platform.python_version(),
        "kernel": platform.release(),
        **{name: v for name in PACKAGES if (v := _package_version(name))},
        "nvidia_driver": _nvidia_driver(),
        "efa_installer": _efa_installer(),
        "aws_ofi_nccl": _aws_ofi_nccl(),
    }
    import torch  # the job's own dependency: present wherever this runs

    versions["cuda"] = torch.version.cuda or absent("torch built without CUDA (CPU build)")
    if on_gpu and torch.cuda.is_available():
        versions["gpu"] = torch.cuda.get_device_name(torch.cuda.current_device())
        try:
            versions["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())
        except (RuntimeError, AttributeError, TypeError) as err:
            versions["nccl"] = absent(f"torch.cuda.nccl.version() failed: {err}")
    else:
        reason = "CPU run (gloo backend): no GPU, no NCCL" if not on_gpu else "no CUDA device visible"
        versions["gpu"], versions["nccl"] = absent(reason), absent(reason)
    return versions


def rank_facts(rank: int, environ: dict | None = None) -> dict[str, Any]:
    """This rank's placement and network environment (gathered to rank 0).

    Node name comes from the downward API (the charts set :data:`~training.contract.ENV_NODE_NAME`
    from ``spec.nodeName``). Instance type is the manifest's (its node selector pins it); the
    node's zone label is not exposed to pods by the downward API, so the zone is the spec's
    GPU zone only where the manifest states it, else absent with the reason."""
    env = os.environ if environ is None else environ
    node = env.get(contract.ENV_NODE_NAME)
    instance = env.get(contract.ENV_INSTANCE_TYPE)
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "node_name": node or absent(f"{contract.ENV_NODE_NAME} unset (not a Kubernetes pod)"),
        "instance_type": instance or absent(f"{contract.ENV_INSTANCE_TYPE} unset (not a Kubernetes pod)"),
        "availability_zone": env.get(contract.ENV_AZ) or absent(
            "node labels are not visible to pods through the downward API; the spec's GPU zone is "
            f"recorded where the manifest sets {contract.ENV_AZ}"),
        "env": {k: v for k, v in sorted(env.items()) if k.startswith(NCCL_ENV_PREFIXES)},
    }


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tree_fingerprint(root: str | Path) -> dict[str, Any]:
    """Content hash of a local file or directory: sha256 over (relative name, sha256 of bytes)."""
    root = Path(root)
    if root.is_file():
        return {"sha256": file_sha256(root), "files": 1, "bytes": root.stat().st_size}
    if not root.is_dir():
        return absent(f"{root} not found on this worker")
    digest, files, size = hashlib.sha256(), 0, 0
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + bytes.fromhex(file_sha256(path)))
        files, size = files + 1, size + path.stat().st_size
    return {"sha256": digest.hexdigest(), "files": files, "bytes": size}


def fingerprint(location: str) -> dict[str, Any]:
    """Content hash (local) or ETag/version ids (``s3://``) of a model, tokenizer or data path."""
    if not location:
        return absent("not given")
    if is_s3(location):
        try:
            return {"uri": location, "objects": object_versions(location)}
        except OSError as err:  # a listing denied or failed is recorded, not raised
            return absent(f"S3 listing failed: {err}")
    return {"path": location, **tree_fingerprint(location)}


def input_fingerprints(job: Any, data: Any) -> dict[str, Any]:
    """run.json ``inputs``: the data (its path plus the content hash of the packed train blocks),
    the model and the tokenizer."""
    import json

    from training.data.tokenizer import tokenizer_location

    blocks = getattr(getattr(data, "train", None), "fingerprint", None)
    data_fp = {"kind": job.data.kind, "train_blocks_sha256": blocks or absent("the stream has no fingerprint")}
    if job.data.kind != "synthetic":
        data_fp["source"] = fingerprint(job.data.path)
    if job.model.path:
        model_fp = fingerprint(job.model.path)
    else:
        canonical = json.dumps(dict(job.model.config), sort_keys=True)
        model_fp = {"built_from_config_sha256": hashlib.sha256(canonical.encode()).hexdigest(),
                    "init_seed": job.train.seed}
    tokenizer = tokenizer_location(job.model) if job.data.kind != "synthetic" else ""
    return {"data": data_fp, "model": model_fp,
            "tokenizer": fingerprint(tokenizer) if tokenizer else absent("synthetic data: no tokenizer")}


def gather(job: Any, *, rank: int, world_size: int, data: Any, on_gpu: bool, run_dir: str) -> dict[str, Any] | None:
    """Every rank: send this rank's facts to all (one collective). Rank 0 gets the run.json
    fields ``versions``, ``ranks``, ``inputs`` and ``nccl_logs``; other ranks None."""
    import torch.distributed as dist

    mine = rank_facts(rank)
    everyone: list = [None] * world_size
    dist.all_gather_object(everyone, mine)
    if rank != 0:
        return None
    logs = ([{"rank": r, "uri": nccl_log_uri(run_dir, r)} for r in range(world_size)] if on_gpu and run_dir
            else [absent("CPU run (gloo): NCCL writes no log" if not on_gpu else "no run directory")])
    return {"versions": collect_versions(on_gpu), "ranks": everyone, "inputs": input_fingerprints(job, data),
            "nccl_logs": logs}
