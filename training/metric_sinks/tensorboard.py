"""TensorBoard: rank 0 writes every figure of ``metrics.jsonl`` as a scalar by step (loss, lr,
grad norm, tokens/s, MFU, memory, evaluations: tag ``<kind>/<key>``) and the job config as text
into ``<run>/tensorboard/``; the driver adds the verdict (:func:`after_run`). ``submit`` copies
the folder with the run, so ``tensorboard --logdir .work/runs`` shows the runs side by side.

Written with tensorboardX (in the DLC) but not through its ``SummaryWriter``: that one hands
events to a writer thread through a queue, and its ``flush()`` does not wait for the queue
(tensorboardX 2.6.5 ``event_file_writer.py``: ``EventFileWriter.flush`` flushes the file only),
so a mirror at the report cadence could miss the newest steps. ``EventsWriter`` writes in the
caller's thread. Nor through its S3 writer, which reads ``S3_ENDPOINT`` rather than the run's
storage: the file is written locally and mirrored into the run directory like metrics.jsonl.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from tensorboardX import summary
from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto import event_pb2

from training import contract, verdict
from training.storage.files import filesystem_for
from training.metric_sinks import row_step, row_time, scalars

TEXT_SUFFIX = "/text_summary"
"""tensorboardX 2.6.5 ``summary.text(tag, ...)`` files text under ``<tag>/text_summary``."""
CONFIG_TAG = "job/config"
VERDICT_TAG = "run/verdict"
ACCEPTED_TAG = "run/accepted"
"""1.0 when the verdict is ``accepted``, else 0.0: a scalar, so runs compare at a glance."""
WORKER_SUFFIX = ".train"
DRIVER_SUFFIX = ".verdict"
"""Each writer's own file: the driver and rank 0 may share a host and a second (the file name
holds both)."""


def config_text(job_config: dict[str, Any]) -> str:
    """The job config as TensorBoard shows text (Markdown): an indented code block of its JSON."""
    return "\n".join("    " + line for line in json.dumps(job_config, indent=2, sort_keys=True).splitlines())


def _event(step: int, proto: Any, wall_time: float | None = None) -> Any:
    return event_pb2.Event(wall_time=time.time() if wall_time is None else wall_time, step=step, summary=proto)


def _put(uri: str, data: bytes) -> None:
    filesystem, path = filesystem_for(uri)
    filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with filesystem.open_output_stream(path) as out:
        out.write(data)


class EventSink:
    """Rank 0's event file in ``<local_dir>/tensorboard``, mirrored to ``<run_dir>/tensorboard``
    at the report cadence and at the end (none when the run directory is the local one)."""

    def __init__(self, local_dir: str, run_dir: str, job_config: dict[str, Any]):
        self.folder = Path(local_dir) / contract.TENSORBOARD_DIR
        self.folder.mkdir(parents=True, exist_ok=True)
        same = not run_dir or ("://" not in run_dir and os.path.abspath(run_dir) == os.path.abspath(local_dir))
        self.target = "" if same else f"{run_dir.rstrip('/')}/{contract.TENSORBOARD_DIR}"
        self.writer = EventsWriter(str(self.folder / "events"), WORKER_SUFFIX)
        self.writer.write_event(_event(0, summary.text(CONFIG_TAG, config_text(job_config))))

    def write(self, row: dict[str, Any]) -> None:
        step, when = row_step(row), row_time(row)
        for tag, value in scalars(row):
            self.writer.write_event(_event(step, summary.scalar(tag, value), when))

    def sync(self) -> None:
        """Flush, and copy this writer's event file to the run directory (S3 cannot append)."""
        self.writer.flush()
        if self.target:  # this writer's file only: the scratch folder may hold an earlier run's
            path = Path(self.writer._file_name)  # tensorboardX 2.6.5 event_file_writer.py:37
            _put(f"{self.target}/{path.name}", path.read_bytes())

    def close(self) -> None:
        self.sync()
        self.writer.close()


def open_sink(job: Any, ctx: Any) -> EventSink | None:
    """Rank 0's event file; None on the other ranks."""
    return EventSink(ctx.local_dir, ctx.run_dir, job.to_dict()) if ctx.rank == 0 else None


def after_run(job: Any, run_dir: str, record: dict[str, Any]) -> None:
    """The driver's verdict, as text and as :data:`ACCEPTED_TAG`, in its own event file beside rank 0's."""
    judged = record.get("verdict") or {}
    step = int(job.train.max_steps)
    with tempfile.TemporaryDirectory() as scratch:
        writer = EventsWriter(os.path.join(scratch, "events"), DRIVER_SUFFIX)
        writer.write_event(_event(step, summary.text(VERDICT_TAG, verdict.headline(judged))))
        writer.write_event(_event(step, summary.scalar(ACCEPTED_TAG, float(judged.get("verdict") == verdict.ACCEPTED))))
        writer.close()
        for name in os.listdir(scratch):
            _put(f"{run_dir.rstrip('/')}/{contract.TENSORBOARD_DIR}/{name}", Path(scratch, name).read_bytes())
