"""The run's own scratch and logs: node-local folders keyed by the run's storage location, and
the Ray logs of every node copied into the run's storage before the cluster goes.

Scratch. Two runs of one name (a job's default run name, in two storage prefixes, or two
buckets) on one host must never share a scratch folder: their metrics and checkpoint staging
would mix. :func:`scratch_key` names a run's folders by its name AND a hash of its storage
location (``<storage_path>/<run_name>``); a resumed run has the same location, so the same key.

Logs. A RayJob's cluster (and with it every node's ``/tmp/ray/session_latest/logs``) is deleted
when the job ends; only what reached the bucket stays. At the end of the run the driver copies,
from every node Ray knows, the training workers' stdout/stderr (``worker-*.out``/``.err``), the
job driver's log (``job-driver-*.log``) and Ray Train's own log into ``<run>/logs/<node ip>/``,
through Ray's state API (``ray.util.state.list_logs``/``get_log``: the dashboard agent on each
node serves its log folder; Ray 2.58.0 ``ray/util/state/api.py``). A file that could not be
copied is named with the reason in ``<run>/logs/index.json``; the copy never fails the run.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from typing import Any

from training.storage.files import write_bytes


def nccl_log_uri(run_dir: str, rank: int) -> str:
    """Where rank ``rank``'s full NCCL log is uploaded: next to run.json."""
    return f"{run_dir.rstrip('/')}/nccl/rank-{rank}.log"


def upload_nccl_log(run_dir: str, rank: int, log_dir: str | None) -> None:
    """Copy this process's NCCL debug file next to run.json (best effort: a failed upload must
    not fail the run; the record already names where the log was expected)."""
    if not (run_dir and log_dir):
        return
    from training.transport import own_nccl_log

    path = own_nccl_log(log_dir)
    if not path:
        return
    try:
        with open(path, "rb") as source:
            write_bytes(nccl_log_uri(run_dir, rank), source.read())
    except Exception as err:  # storage trouble shows elsewhere (checkpoints); never here first
        print(f"warning: NCCL log of rank {rank} not uploaded: {type(err).__name__}: {err}", flush=True)




RUN_LOGS_DIR = "logs"
"""The run's log folder inside its run directory (``raytrain-eks logs`` reads it too)."""
DRIVER_LOG = "driver.log"
"""The job driver's log, also at the top of :data:`RUN_LOGS_DIR` for ``raytrain-eks logs RUN``."""
COPIED_LOGS = ("worker-*.out", "worker-*.err", "job-driver-*.log", "train/*.log")
MAX_LOG_BYTES = 8 << 20
"""Per file, the last 8 MiB: a run's logs must not cost more than its records."""


def scratch_key(run_dir: str, run_name: str) -> str:
    """``<run name>-<12 hex of sha256(run_dir)>``: one folder name per storage location."""
    digest = hashlib.sha256(run_dir.rstrip("/").encode()).hexdigest()[:12]
    return f"{run_name}-{digest}"


def _wanted(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in COPIED_LOGS)


def _write_log(run_dir: str, relative: str, data: bytes) -> None:
    """One file under the run's log folder, through the storage room."""
    write_bytes(f"{run_dir.rstrip('/')}/{RUN_LOGS_DIR}/{relative}", data)


def copy_cluster_logs(run_dir: str) -> dict[str, Any]:
    """Copy every live node's training, worker and driver logs into ``<run>/logs/``; returns the
    index it wrote (``{"copied": [...], "absent": {file: why}}``). Never raises."""
    index: dict[str, Any] = {"copied": [], "absent": {}}
    if not run_dir:
        return index
    try:
        import ray
        from ray.util.state import get_log, list_logs

        nodes = [n for n in ray.nodes() if n.get("Alive")]
    except Exception as err:  # noqa: BLE001 - the run's outcome does not depend on its logs
        index["absent"]["*"] = f"{type(err).__name__}: {err}"
        nodes = []
    for node in nodes:
        ip = node.get("NodeManagerAddress", "node")
        try:
            listed = list_logs(node_id=node["NodeID"])
            names = sorted({n for group in listed.values() for n in group if _wanted(n)})
        except Exception as err:  # noqa: BLE001
            index["absent"][f"{ip}/*"] = f"{type(err).__name__}: {err}"
            continue
        for name in names:
            try:
                text = "".join(get_log(node_id=node["NodeID"], filename=name, errors="replace"))
                data = text.encode("utf-8")[-MAX_LOG_BYTES:]
                _write_log(run_dir, f"{ip}/{name}", data)
                if fnmatch.fnmatch(os.path.basename(name), "job-driver-*.log"):
                    _write_log(run_dir, DRIVER_LOG, data)
                index["copied"].append(f"{ip}/{name}")
            except Exception as err:  # noqa: BLE001
                index["absent"][f"{ip}/{name}"] = f"{type(err).__name__}: {err}"
    try:
        _write_log(run_dir, "index.json", (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())
    except Exception:  # noqa: BLE001
        pass
    return index
