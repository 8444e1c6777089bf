"""run.json: what produced a run, written next to its checkpoints at start and at the end.

Standard library only at import (its files are read and written through :mod:`training.storage.files`).
The driver is the record's only writer (training/launch.py): it writes it at start and, once
the fit returned, merges what rank 0 returned (:data:`~training.contract.WORKER_RECORD_FIELDS`:
every rank's facts gathered by one collective, the figures it measured) in the final write.

The environment variables the manifests set on every Ray pod are named in
:mod:`training.contract` (``ENV_*``).

Missing variables are recorded as ``""`` (a local run has no image); the code hash is also computed
in-process from the files that actually ran (:func:`code_hash`), and the job config's from the
resolved config, both next to the manifest's values (``{"ran": ..., "manifest": ...}``).

API::

    record = RunRecord(run_dir)                     # local directory or "s3://bucket/prefix/run"
    record.start(job_config=config.to_dict(), is_infrastructure_check=config.is_infrastructure_check,
                 cluster={"nodes": 2, "gpus_per_node": 4, "world_size": 8})
    record.finish(status="succeeded", hosts={"0": "ip-10-0-0-1", ...}, transport=evidence,
                  throughput={...}, eval={"before": {"loss": 3.1, "ppl": 22.2}}, checkpoints=[...])
    # or finish(status="failed", error=str(err)); update(**fields) rewrites it in between

:meth:`RunRecord.finish` also writes the ``verdict`` (training/verdict.py: accepted, rejected or
execution-failed, judged against the job config's ``[accept]``), the exit code that goes with
it, and the ``reproducibility`` level the record pins. What ran (versions, per-rank placement,
inputs' fingerprints) comes from rank 0's worker (:func:`training.run_facts.gather`), not from the driver.

Every write replaces the whole file (a local write is atomic via rename; an S3 PUT is atomic).
"""
from __future__ import annotations

import base64
import json
import os
import platform
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from training import contract, verdict
from training.storage.files import read_json, read_retrying, write_json

SCHEMA_VERSION = 2
_REPLACED = frozenset({"versions"})
"""Fields a later update replaces whole: rank 0's worker's versions replace the driver's."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def code_hash(root: str | Path | None = None) -> str:
    """The code archive's tree hash (:func:`training.contract.tree_hash`), recomputed from the
    files that are actually here. ``root`` is the folder holding ``training/`` (default: this
    package's parent = Ray's working_dir)."""
    base = Path(root) if root else Path(__file__).resolve().parent.parent
    return contract.tree_hash(contract.code_files(base))


def image_from_env(environ: dict | None = None) -> tuple[str, str]:
    """``(reference, digest)`` from RAYTRAIN_IMAGE; the digest is ``""`` for an unlocked tag."""
    reference = (os.environ if environ is None else environ).get(contract.ENV_IMAGE, "")
    digest = reference.split("@", 1)[1] if "@" in reference else ""
    return reference, digest


def driver_versions() -> dict[str, Any]:
    """What the driver can say before a worker reports: where the versions will come from. The
    driver runs on the head pod (CPU, no GPU driver), so GPU, driver, CUDA and NCCL are read by
    rank 0's worker (:func:`collect_versions`) and replace this."""
    return {"read_on": f"driver on {socket.gethostname()} (replaced by what rank 0's worker returns)",
            "python": platform.python_version()}


def spec_text(environ: dict) -> str | dict:
    """The environment spec's text from :data:`~training.contract.ENV_SPEC_TEXT` (base64)."""
    encoded = environ.get(contract.ENV_SPEC_TEXT, "")
    if not encoded:
        return {"absent": f"{contract.ENV_SPEC_TEXT} unset (not started from a synthesized manifest)"}
    try:
        return base64.b64decode(encoded).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as err:
        return {"absent": f"{contract.ENV_SPEC_TEXT} is not base64 UTF-8: {err}"}


def source_identity(environ: dict) -> dict[str, Any]:
    """Git commit + dirty flag + source hash, captured when the manifests were synthesized."""
    commit = environ.get(contract.ENV_GIT_COMMIT, "")
    dirty = environ.get(contract.ENV_GIT_DIRTY, "")
    return {
        "git_commit": commit or {"absent": f"{contract.ENV_GIT_COMMIT} unset or the synth tree was no git checkout"},
        "git_dirty": {"true": True, "false": False}.get(dirty, {"absent": f"{contract.ENV_GIT_DIRTY} unset"}),
        "hash": environ.get(contract.ENV_SOURCE_HASH, ""),
        "paths": list(contract.SOURCE_PATHS),
    }


def declare_reproducibility(record: dict[str, Any]) -> dict[str, Any]:
    """The level a run CAN be reproduced at, from what its record pins (never verified here:
    ``raytrain-eks reproduce`` verifies infrastructure; only a repeated run shows result).

    - infrastructure: the manifest (its hash), a locked image digest and a clean git commit;
    - execution: plus the seeds and the data's content hash (the same data order);
    - result: bit-identical losses; a claim only a second run can check.
    """
    source = record.get("source") or {}
    missing = [name for name, ok in (
        ("manifest hash", bool(record.get("manifest_hash"))),
        ("image digest (the image is a tag)", bool(record.get("image_digest"))),
        ("git commit", isinstance(source.get("git_commit"), str)),
        ("clean tree (synthesized with uncommitted changes)", source.get("git_dirty") is False),
    ) if not ok]
    data = (record.get("inputs") or {}).get("data") or {}
    config = record.get("job_config") or {}
    seeded = isinstance(data.get("train_blocks_sha256"), str) and "seed" in (config.get("train") or {})
    level = "none" if missing else ("execution" if seeded else "infrastructure")
    return {"declared": level, "missing_for_infrastructure": missing,
            "execution_pins": {"train.seed": (config.get("train") or {}).get("seed"),
                               "data.seed": (config.get("data") or {}).get("seed"),
                               "train_blocks_sha256": data.get("train_blocks_sha256")},
            "verified": "none (run `raytrain-eks reproduce` on this run directory)"}


NOT_TIMED = ("the job does not time its collectives (FSDP2 runs them on streams of their own on a GPU, "
             "in gloo's threads on a CPU: only a device trace shows what compute hid)")


def exposed_comm_handed(storage_path: str, run: str) -> dict[str, Any]:
    """run.json's ``exposed_comm``: the step model's prediction ``submit`` handed this run
    (:func:`training.contract.run_inputs_uri`), else label ``unknown`` and why."""
    handed = None
    if storage_path and run:
        try:
            handed = read_json(contract.run_inputs_uri(storage_path, run)).get(contract.STEP_PREDICTION)
        except (OSError, ValueError, AttributeError):  # no such file (no prediction, a plain process)
            handed = None
    if isinstance(handed, dict) and handed.get("label") == "predicted":
        return handed
    return {"label": "unknown", "why": f"{NOT_TIMED}; no step-model prediction was handed to the run "
                                       "(raytrain_eks/planning/step_model.py predicts GPU plans with a measured trace)"}


class RunRecord:
    """The run record of one run directory; only the driver writes it."""

    def __init__(self, run_dir: str, environ: dict | None = None) -> None:
        self.run_dir = run_dir.rstrip("/")
        self._environ = dict(os.environ if environ is None else environ)
        self.data: dict[str, Any] = {}

    @property
    def uri(self) -> str:
        return f"{self.run_dir}/{contract.RECORD_NAME}"

    def start(self, *, job_config: dict, is_infrastructure_check: bool, cluster: dict | None = None,
              versions: dict | None = None, command: list[str] | None = None, exposed_comm: dict | None = None) -> dict:
        """Write the first version of the record (status ``running``); returns it.

        ``cluster`` adds to/overrides ``{"instance_type": $RAYTRAIN_INSTANCE_TYPE, "cluster":
        $RAYTRAIN_CLUSTER}``; give at least ``nodes``, ``gpus_per_node`` and ``world_size``.
        """
        env = self._environ
        # A driver KubeRay retried (RayJob backoffLimit > 0) starts the record again at the same
        # run directory: the faults the earlier driver recorded are part of this run's story.
        earlier = read_retrying(self.uri)
        earlier_incidents = list(json.loads(earlier.decode("utf-8")).get(contract.INCIDENTS) or []) if earlier else []
        self.data = {
            "schema_version": SCHEMA_VERSION,
            "run_dir": self.run_dir,
            "kind": "infrastructure_check" if is_infrastructure_check else "fine_tune",
            "is_infrastructure_check": bool(is_infrastructure_check),
            # A plain string: the promote gate checks record["image"].endswith("@" + digest).
            "image": image_from_env(env)[0],
            "image_digest": image_from_env(env)[1],
            "code_hash": {"ran": code_hash(), "manifest": env.get(contract.ENV_CODE_HASH, "")},
            "spec_hash": env.get(contract.ENV_SPEC_HASH, ""),
            "manifest_hash": env.get(contract.ENV_MANIFEST_HASH, ""),
            "job_config": job_config,
            "job_config_hash": {"ran": contract.job_config_hash(job_config),
                                "manifest": env.get(contract.ENV_JOB_CONFIG_HASH, "")},
            "cluster": {"instance_type": env.get(contract.ENV_INSTANCE_TYPE, ""), "cluster": env.get(contract.ENV_CLUSTER, ""),
                        **(cluster or {})},
            "versions": versions if versions is not None else driver_versions(),
            "hosts": {"driver": socket.gethostname()},
            "transport": {"transport": "unknown", "ranks": []},
            "throughput": {},
            "eval": {"before": None, "after": None},
            "benchmarks": None,  # {"before", "after"}: eval.benchmarks' scores (training/evaluation.py)
            "objective": None,  # train.objective and its options with defaults (training/objectives/)
            "checkpoints": [],
            "exports": {},
            "data": {},
            "start_time": _now(),
            "end_time": None,
            "duration_s": None,
            "status": "running",
            "exit_code": None,
            "error": None,
            "command": list(sys.argv if command is None else command),
            contract.FAILURE: {},
            "source": source_identity(env),
            "manifest_name": env.get(contract.ENV_MANIFEST_NAME, ""),
            "environment_spec": {"text": spec_text(env)},  # its hash: spec_hash (contract.HASHES)
            "inputs": {}, "ranks": [], "nccl_logs": [], "reproducibility": {}, "verdict": None,
            "netcheck": None,
            # a local run's bucket ends with its submit: a stop there is final (training/verdict.py)
            contract.STORAGE_LIVES_FOR_ONE_SUBMIT: env.get(contract.STORAGE_LIVES_FOR_ONE_SUBMIT_ENV) == "1",
            "exposed_comm": exposed_comm or exposed_comm_handed("", ""),
            # worker groups, faults and cost: the driver fills them at the end (training/incidents.py)
            "attempts": [], contract.INCIDENTS: earlier_incidents, contract.COST: {},  # INCIDENTS: appended as faults are seen
            # what each hash and throughput figure of this record is (one definition each)
            "definitions": {"hashes": dict(contract.HASHES), "throughput": dict(contract.FIGURES)},
        }
        self._write()
        return self.data

    def update(self, **fields: Any) -> dict:
        """Merge top-level fields (dicts are merged one level deep) and rewrite the record.

        Transport evidence also fills ``versions.nccl`` / ``versions.aws_ofi_nccl`` when they are
        empty: NCCL's own log is the only reliable source of the plugin's version.
        """
        for key, value in fields.items():
            if key not in contract.RECORD_FIELDS:
                raise KeyError(f"run record has no field {key!r} (fields: {', '.join(contract.RECORD_FIELDS)})")
            if isinstance(value, dict) and isinstance(self.data.get(key), dict) and key not in _REPLACED:
                self.data[key] = {**self.data[key], **value}
            else:
                self.data[key] = value
        if isinstance(self.data.get("transport"), dict) and isinstance(self.data.get("versions"), dict):
            self.data["versions"].update(self._versions_from_log(self.data["transport"]))
        self._write()
        return self.data

    def _versions_from_log(self, evidence: dict) -> dict[str, str]:
        known = self.data.get("versions") or {}
        found = {}
        for rank in evidence.get("ranks", []):
            for field_name, key in (("nccl_version", "nccl"), ("ofi_nccl_version", "aws_ofi_nccl")):
                if rank.get(field_name) and not isinstance(known.get(key), str) and key not in found:
                    found[key] = rank[field_name]
        return found

    def finish(self, *, status: str = "succeeded", error: str | None = None, exit_code: int | None = None,
               **fields: Any) -> dict:
        """Final write: status, error, end time and duration (plus any last fields)."""
        if status not in contract.RECORD_STATUSES[1:]:
            raise ValueError(f"status: {status!r} is not allowed (allowed: {', '.join(contract.RECORD_STATUSES[1:])})")
        end = datetime.now(timezone.utc)
        started = datetime.fromisoformat(self.data["start_time"]) if self.data.get("start_time") else end
        fields.update(status=status, error=error, end_time=end.isoformat(timespec="seconds"),
                      duration_s=round((end - started).total_seconds(), 3))
        self.update(**fields)
        self.data["verdict"] = verdict.judge(self.data)
        self.data["reproducibility"] = declare_reproducibility(self.data)
        if exit_code is None:
            exit_code = 143 if status == "stopped" else verdict.exit_code(self.data["verdict"])
        return self.update(exit_code=exit_code)

    def _write(self) -> None:
        write_json(self.uri, self.data)
