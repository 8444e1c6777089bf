"""A run in one process (training/launch.py ``run_in_process``: its driver and its only worker)
SIGKILLed from outside once its checkpoint of step k is complete in the session's store, while
the store holds the next checkpoint's upload (devtools/strike.py): the process can neither save a
newer checkpoint nor end before the kill, however far its loop got. Used by the LoRA and DPO
resume proofs (tests/training/test_lora_run.py, test_dpo_run.py)."""
from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any


def killed_after_checkpoint(argv: list[str], *, store: Any, run_uri: str, saved_step: int, held: str,
                            cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run ``argv``; SIGKILL it once ``<run_uri>/checkpoint_<saved_step>`` is complete
    (training/checkpointing ``remote_problem``: every rank's files and the marker), the uploads
    whose path holds ``held`` (a later checkpoint, or the export: one the run's end waits for, of
    well over 4 MB, devtools/strike.py ``HOLD``) held until then. Where ``held`` is the export, a
    later checkpoint too small to hold (a LoRA run's adapter) may complete before the kill: the
    caller resumes from ``saved_step`` by name (waiting for "the newest" would race the steps
    between the two, a few seconds on an idle machine). Returns what it printed."""
    from devtools.strike import Strike
    from training.checkpointing.manager import checkpoint_dir_name
    from training.checkpointing.markers import remote_problem

    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def saved() -> bool:
        return remote_problem(f"{run_uri}/{checkpoint_dir_name(saved_step)}") is None

    try:
        with Strike(store, held=held, ready=saved,
                    fault=lambda: proc.send_signal(signal.SIGKILL),
                    what=f"{checkpoint_dir_name(saved_step)} of {run_uri} complete"):
            stdout, stderr = proc.communicate(timeout=1500)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def download(s3: Any, uri: str, dest: Path) -> Path:
    """Every object under ``uri`` into ``dest`` (a model to load with ``from_pretrained``)."""
    from raytrain_eks.runs.results import list_keys, split_uri

    bucket, prefix = split_uri(uri)
    for key in list_keys(s3, uri):
        target = dest / key[len(prefix.rstrip("/")) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, key, str(target))
    return dest
