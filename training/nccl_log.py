"""Where NCCL writes its INFO log: the one folder and file name every rank uses, and the
environment that points NCCL there. Standard library only.

NCCL opens ``NCCL_DEBUG_FILE`` at its first collective; if the folder does not exist it silently
logs to stdout instead, and the rank has no evidence of its transport. So the folder is created
first (:func:`prepare_nccl_logging`), and a missing file is explained (:func:`missing_log_cause`).
"""
from __future__ import annotations

import glob
import os

LOG_NAME = "nccl.%h.%p.log"
NCCL_LOG_DIR = "/tmp/raytrain-nccl"
"""Node-local folder for NCCL's INFO log. NCCL does not create it: when NCCL_DEBUG_FILE cannot be
opened it silently logs to stdout, so :func:`prepare_nccl_logging` creates it first."""


def nccl_debug_env(log_dir: str, environ: dict | None = None) -> dict[str, str]:
    """Environment that makes NCCL log the transport into ``log_dir/nccl.<host>.<pid>.log``.

    Keeps a user's own NCCL_DEBUG/NCCL_DEBUG_SUBSYS when set (WARN would hide the evidence, so
    it is raised to INFO). ``log_dir`` must be node-local and writable (e.g. :data:`NCCL_LOG_DIR`).
    """
    environ = os.environ if environ is None else environ
    level = environ.get("NCCL_DEBUG", "").upper()
    return {
        "NCCL_DEBUG": level if level in ("INFO", "TRACE") else "INFO",
        "NCCL_DEBUG_SUBSYS": environ.get("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        "NCCL_DEBUG_FILE": os.path.join(log_dir, LOG_NAME),
    }


def prepare_nccl_logging(log_dir: str, environ: dict | None = None) -> dict[str, str]:
    """Create ``log_dir`` and point NCCL's INFO log into it; call before NCCL's first collective.

    Updates ``environ`` (default ``os.environ``) and returns the variables set. The folder must
    exist before NCCL opens the file, or NCCL writes to stdout and the rank has no evidence.
    """
    environ = os.environ if environ is None else environ
    os.makedirs(log_dir, exist_ok=True)
    env = nccl_debug_env(log_dir, environ)
    environ.update(env)
    return env


def prepare_worker(on_gpu: bool, environ: dict | None = None) -> str | None:
    """A worker's first act, before ANY collective of the process: on GPU, point NCCL's log into
    :data:`NCCL_LOG_DIR`; on any backend, create the folder ``NCCL_DEBUG_FILE`` names (the
    driver sets it from the worker's start, :func:`nccl_debug_env`). Returns that folder (None
    when NCCL_DEBUG_FILE is unset).

    NCCL opens its debug file once, in its lazy initialisation at the process's first collective
    (NVIDIA/nccl, src/debug.cc ``ncclDebugInit``: ``fopen`` of NCCL_DEBUG_FILE, stdout when that
    fails); the process group's creation is not one (torch creates communicators lazily). A
    collective before this call would leave the rank without its log for the whole process."""
    environ = os.environ if environ is None else environ
    if on_gpu:
        prepare_nccl_logging(NCCL_LOG_DIR, environ)
    target = environ.get("NCCL_DEBUG_FILE", "")
    folder = os.path.dirname(target)
    if folder:
        os.makedirs(folder, exist_ok=True)
    return folder or None


def missing_log_cause(log_dir: str, environ: dict | None = None) -> str:
    """Why this process has no NCCL debug file in ``log_dir``: the likely cause, in one line."""
    environ = os.environ if environ is None else environ
    level = environ.get("NCCL_DEBUG", "").upper()
    target = environ.get("NCCL_DEBUG_FILE", "")
    if level not in ("INFO", "TRACE"):
        hint = f"NCCL_DEBUG is {level or 'unset'}: set NCCL_DEBUG=INFO so the transport can be proven"
    elif not os.path.isdir(log_dir):
        hint = f"folder {log_dir} does not exist, so NCCL logged to stdout instead of {target}"
    elif not os.access(log_dir, os.W_OK):
        hint = f"folder {log_dir} is not writable, so NCCL logged to stdout instead of {target}"
    elif target and os.path.dirname(target) != log_dir.rstrip("/"):
        hint = f"NCCL_DEBUG_FILE={target} points outside {log_dir}"
    else:
        hint = (f"NCCL_DEBUG={level} and NCCL_DEBUG_FILE={target or '(unset)'} but NCCL wrote no file for pid "
                f"{os.getpid()}: was NCCL initialised before these variables were set?")
    return hint


def own_nccl_log(log_dir: str, pid: int | None = None) -> str | None:
    """This process's NCCL debug file in ``log_dir`` (NCCL expands %h to the short host name)."""
    matches = sorted(glob.glob(os.path.join(log_dir, f"nccl.*.{pid or os.getpid()}.log")))
    return matches[-1] if matches else None
