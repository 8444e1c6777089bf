"""Training's contract with everything around it: one definition of each name that crosses a
package boundary.

Standard library only, so the charts (which set the environment variables), the operator CLI
(which reads run.json and metrics.jsonl) and the tests import the very names the job uses. A
string typed twice drifts; a name imported from here cannot.

What lives here:

- the ``RAYTRAIN_*`` environment variables the manifests set and the job reads;
- the keys of ``metrics.jsonl`` rows and of ``run.json``;
- the one definition of a steady-state throughput figure (median over the steps, the first
  excluded), used by the loop's run.json summary and by the report;
- the code tree hash: which files travel to the pods and how their content is hashed, used by
  the code archive builder (charts) and by the job itself (what actually ran).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterable

# --- environment variables the manifests set on every Ray pod -------------------------------
ENV_IMAGE = "RAYTRAIN_IMAGE"
"""Image reference the manifest asked for: ``repo@sha256:...`` (or ``repo:tag`` if unlocked)."""
ENV_CODE_HASH = "RAYTRAIN_CODE_HASH"
"""Tree hash of the code archive the manifest names (:func:`tree_hash`)."""
ENV_SPEC_HASH = "RAYTRAIN_SPEC_HASH"
"""Hash of the environment spec the manifest was synthesized from."""
ENV_JOB_CONFIG_HASH = "RAYTRAIN_JOB_CONFIG_HASH"
"""Hash of the job config + overrides the manifest was built with."""
ENV_INSTANCE_TYPE = "RAYTRAIN_INSTANCE_TYPE"
"""EC2 instance type of the pod's node group (``g6.12xlarge``)."""
ENV_CLUSTER = "RAYTRAIN_CLUSTER"
"""EKS cluster name."""
ENV_REGION = "RAYTRAIN_REGION"
"""AWS region of the cluster."""
ENV_MANIFEST_HASH = "RAYTRAIN_MANIFEST_HASH"
"""Hash of the synthesized manifest the pod belongs to."""
ENV_PEAK_TFLOPS = "RAYTRAIN_PEAK_BF16_TFLOPS"
"""Peak dense bf16 TFLOP/s of ONE GPU of the pod's instance type (from the environment
package's instance table): the denominator of MFU. Unset on CPU, where MFU is n/a."""
ENV_FAULT_AT_STEP = "RAYTRAIN_FAULT_AT_STEP"
"""Test and demo hook: a rank exits hard once after this many steps."""
ENV_FAULT_RANK = "RAYTRAIN_FAULT_RANK"
"""The rank :data:`ENV_FAULT_AT_STEP` applies to (default 0)."""
ENV_CACHE_DIR = "RAYTRAIN_CACHE_DIR"
"""Node-local cache of data, tokenizer and model files fetched from S3."""
ENV_CHECKPOINT_LOCAL_DIR = "RAYTRAIN_CHECKPOINT_LOCAL_DIR"
"""Node-local folder where checkpoints are staged before their upload."""
ENV_PREFIX = "RAYTRAIN_"
"""Every variable above starts with this; the driver forwards them to its workers."""

# --- files of a run directory ---------------------------------------------------------------
RECORD_NAME = "run.json"
METRICS_NAME = "metrics.jsonl"

# --- metrics.jsonl rows ---------------------------------------------------------------------
KIND = "kind"
KIND_TRAIN = "train"
KIND_EVAL = "eval"
KIND_SUMMARY = "summary"
STEP = "step"
LOSS = "loss"
LR = "lr"
GRAD_NORM = "grad_norm"
TOKENS_SEEN = "tokens_seen"
STEP_TIME_S = "step_time_s"
"""Wall time of one optimizer step, from batch fetch to the end of the step's own work."""
COMPUTE_S = "compute_s"
PEAK_MEMORY_GIB = "peak_memory_gib"
TOKENS_PER_S = "tokens_per_s"
TOKENS_PER_S_PER_DEVICE = "tokens_per_s_per_device"
TFLOPS_PER_DEVICE = "tflops_per_device"
MFU = "mfu"
WALL_TIME = "time"
EVAL_LOSS = "eval_loss"
EVAL_PERPLEXITY = "eval_perplexity"

THROUGHPUT_KEYS = (TOKENS_PER_S, TOKENS_PER_S_PER_DEVICE, TFLOPS_PER_DEVICE, MFU, STEP_TIME_S)
"""Figures summarised by :func:`steady_median` (run.json ``throughput`` and the report)."""
STEPS_MEASURED = "steps_measured"

# --- run.json -------------------------------------------------------------------------------
RECORD_FIELDS = (
    "schema_version", "run_dir", "kind", "is_infrastructure_check", "image", "image_digest", "code_hash",
    "spec_hash", "manifest_hash", "job_config", "job_config_hash", "cluster", "versions", "hosts", "transport",
    "throughput", "eval", "checkpoints", "data", "start_time", "end_time", "duration_s", "status",
    "exit_code", "error", "command",
)
"""Every top-level key a finished run.json holds."""
RECORD_STATUSES = ("running", "succeeded", "failed", "stopped")


def steady_median(rows: list[dict[str, Any]], key: str) -> Any:
    """THE steady-state figure of a run: the median of ``key`` over the train rows, the first
    (warm-up: allocator growth, compilation) excluded when there are others. The median, not the
    mean: one step stalled by a checkpoint or a noisy neighbour must not move the figure."""
    steady = rows[1:] or rows
    values = sorted(r[key] for r in steady if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool))
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def throughput_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """run.json's ``throughput``: :func:`steady_median` of every throughput key, the peak memory
    (the maximum over all steps) and how many steps were measured."""
    if not rows:
        return {}
    summary: dict[str, Any] = {key: steady_median(rows, key) for key in THROUGHPUT_KEYS}
    memory = [r[PEAK_MEMORY_GIB] for r in rows if isinstance(r.get(PEAK_MEMORY_GIB), (int, float))]
    summary[PEAK_MEMORY_GIB] = max(memory) if memory else None
    summary[STEPS_MEASURED] = len(rows[1:] or rows)
    return summary


# --- the code that travels to the pods -------------------------------------------------------
CODE_DIRS = ("training", "jobs")
"""Folders of the repository packed into the code archive; the job's working directory holds
exactly these."""
_SKIP_DIRS = frozenset({"__pycache__"})
_SKIP_SUFFIXES = (".pyc", ".pyo")


def code_files(root: str | Path, dirs: Iterable[str] = CODE_DIRS) -> list[tuple[str, Path]]:
    """``(archive name, file)`` of every file under ``root/<dir>`` that travels, sorted by name.

    Hidden entries, ``__pycache__`` and compiled files stay behind; a missing folder is an error
    (an archive without it could not run)."""
    root = Path(root)
    found = []
    for top in dirs:
        base = root / top
        if not base.is_dir():
            raise FileNotFoundError(f"{base}: missing (the code archive needs {', '.join(dirs)})")
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
            for filename in filenames:
                path = Path(dirpath, filename)
                if filename.startswith(".") or filename.endswith(_SKIP_SUFFIXES) or not path.is_file():
                    continue
                found.append((path.relative_to(root).as_posix(), path))
    return sorted(found)


def tree_hash(files: list[tuple[str, Path]]) -> str:
    """sha256 over each file's archive name, a NUL and the sha256 of its bytes, in name order;
    the first 16 hex. The content decides, not the zip bytes or file times."""
    digest = hashlib.sha256()
    for name, path in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]
