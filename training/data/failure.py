"""Data errors in a real run: found by a worker, reported by the driver in ONE line, never retried.

Ray Train retries any worker error up to ``checkpoint.max_failures`` times, and a data error is
deterministic: every retry would read the same bad line again. So a worker does not raise it.
:func:`agree_on_data` runs right after every rank has tried to open its data: the ranks agree
(one all-reduce) whether any failed; a failed rank writes a marker (what, where, which rank)
into the run directory, and then EVERY rank returns normally, so no rank waits in a collective
and Ray sees a finished run with nothing to retry. The driver reads the markers of its own
attempt (:func:`read_data_errors`) and ends the run as failed at the data stage.
"""
from __future__ import annotations

import json
from typing import Any

from training.data.records import DataError

MARKER_PREFIX = "data-error-"


def marker_name(token: str, rank: int) -> str:
    return f"{MARKER_PREFIX}{token}-rank-{rank}.json"


def agree_on_data(error: DataError | None, *, rank: int, device: Any, write: Any) -> bool:
    """True when every rank opened its data; else the failed ranks have called ``write(payload)``.

    ``device``: where the flag tensor lives (cuda for NCCL, cpu for gloo)."""
    import torch
    import torch.distributed as dist

    if error is not None:
        write({"rank": rank, "error_class": type(error).__name__, "error": str(error)})
    flag = torch.tensor([1.0 if error is not None else 0.0], device=device)
    if dist.is_initialized():
        dist.all_reduce(flag)
    return float(flag.item()) == 0.0


def storage_writer(storage: Any, token: str, rank: int):
    """``write(payload)`` into Ray's run directory (``StorageContext``) as this rank's marker."""
    def write(payload: dict) -> None:
        fs, base = storage.storage_filesystem, storage.experiment_fs_path
        fs.create_dir(base, recursive=True)
        with fs.open_output_stream(f"{base}/{marker_name(token, rank)}") as out:
            out.write(json.dumps(payload).encode("utf-8"))
    return write


def read_data_errors(run_dir: str, token: str) -> list[dict]:
    """The markers this attempt's ranks wrote under ``run_dir``, lowest rank first."""
    import pyarrow.fs as pafs

    from training.checkpointing.storage import filesystem_for

    try:
        fs, path = filesystem_for(run_dir)
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except (OSError, ValueError):
        return []
    found = []
    for info in infos:
        name = info.path.rsplit("/", 1)[-1]
        if info.type == pafs.FileType.File and name.startswith(f"{MARKER_PREFIX}{token}-"):
            with fs.open_input_stream(info.path) as stream:
                found.append(json.loads(stream.read().decode("utf-8")))
    return sorted(found, key=lambda m: m.get("rank", 0))


def one_line(errors: list[dict]) -> str:
    """What, where, which rank: ``DataError on rank 0 (and 1 more): <file, line: problem>``."""
    first = errors[0]
    more = f" (and {len(errors) - 1} more rank{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{first.get('error_class', 'DataError')} on rank {first.get('rank')}{more}: {first.get('error')}"
