"""run.json: what produced a run, written next to its checkpoints at start and at the end.

Standard library only at import (pyarrow, torch and boto3 are imported when used: the DLC has them).
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
inputs' fingerprints) comes from rank 0's worker (:func:`gather`, below), not from the driver.

Every write replaces the whole file (a local write is atomic via rename; an S3 PUT is atomic).

What ran, read on a training worker: versions, per-rank placement, inputs' fingerprints.

The driver of a RayJob runs on the head pod (a CPU node, ``NVIDIA_VISIBLE_DEVICES=void``): GPU,
driver, CUDA and NCCL read there are empty or wrong. So rank 0's worker reads the versions
(:func:`collect_versions`) and every rank its own placement (:func:`rank_facts`), gathered to
rank 0 by one collective; rank 0 returns them to the driver, which writes them into run.json.

A fact that cannot be read is recorded as absent WITH the reason (:func:`absent`), never
guessed: ``{"absent": "no NVIDIA driver on this node (/proc/driver/nvidia/version missing)"}``.

The run's own scratch and logs: node-local folders keyed by the run's storage location, and
the Ray logs of every node copied into the run's storage before the cluster goes.
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

import base64
import fnmatch
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from training import contract, verdict

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
            "exposed_comm": exposed_comm or exposed_comm_handed("", ""),
            # worker groups, faults and cost: the driver fills them at the end (training/incidents.py)
            "attempts": [], contract.INCIDENTS: [], contract.COST: {},
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


def write_json(uri: str, data: dict) -> None:
    """Write JSON to a local path (atomically) or an ``s3://`` URI (pyarrow, as Ray Train does)."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    if "://" not in uri or uri.startswith("file://"):
        path = Path(uri.removeprefix("file://"))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        return
    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(uri)
    with filesystem.open_output_stream(path) as stream:
        stream.write(text.encode("utf-8"))


def read_json(uri: str) -> dict:
    """Read run.json (or any JSON file) from a local path or an ``s3://`` URI."""
    if "://" not in uri or uri.startswith("file://"):
        return json.loads(Path(uri.removeprefix("file://")).read_text(encoding="utf-8"))
    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(uri)
    with filesystem.open_input_stream(path) as stream:
        return json.loads(stream.read().decode("utf-8"))


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


def s3_fingerprint(uri: str) -> dict[str, Any]:
    """ETag and version id of every object under an ``s3://`` prefix (boto3, as in the DLC)."""
    import boto3  # in the DLC (Ray's runtime-env agent downloads working_dir with it)

    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    client = boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None)
    objects = []
    try:
        for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
            objects += [{"key": v["Key"], "etag": v["ETag"].strip('"'), "version_id": v.get("VersionId"),
                         "size": v["Size"]} for v in page.get("Versions", []) if v.get("IsLatest")]
    except Exception as err:  # ListObjectVersions may be denied: fall back to ETags alone
        try:
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                objects += [{"key": o["Key"], "etag": o["ETag"].strip('"'), "size": o["Size"]}
                            for o in page.get("Contents", [])]
        except Exception as err2:
            return absent(f"S3 listing failed: {type(err).__name__}; {type(err2).__name__}: {err2}")
    return {"uri": uri, "objects": sorted(objects, key=lambda o: o["key"])}


def fingerprint(location: str) -> dict[str, Any]:
    """Content hash (local) or ETag/version ids (``s3://``) of a model, tokenizer or data path."""
    if not location:
        return absent("not given")
    if location.startswith("s3://"):
        return s3_fingerprint(location)
    return {"path": location, **tree_fingerprint(location)}


def input_fingerprints(job: Any, data: Any) -> dict[str, Any]:
    """run.json ``inputs``: the data (its path plus the content hash of the packed train blocks),
    the model and the tokenizer."""
    import json

    from training.tokenizer import tokenizer_location

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
        from training.checkpointing.storage import filesystem_for

        filesystem, target = filesystem_for(nccl_log_uri(run_dir, rank))
        filesystem.create_dir(target.rsplit("/", 1)[0], recursive=True)
        with open(path, "rb") as source, filesystem.open_output_stream(target) as out:
            out.write(source.read())
    except Exception as err:  # storage trouble shows elsewhere (checkpoints); never here first
        print(f"warning: NCCL log of rank {rank} not uploaded: {type(err).__name__}: {err}", flush=True)


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
    """A local path or an ``s3://`` URI, written as run.json is (:func:`write_json`)."""
    uri = f"{run_dir.rstrip('/')}/{RUN_LOGS_DIR}/{relative}"
    if "://" not in uri or uri.startswith("file://"):
        path = uri.removeprefix("file://")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
        return
    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(uri)
    with filesystem.open_output_stream(path) as stream:
        stream.write(data)


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
