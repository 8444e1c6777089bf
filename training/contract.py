"""Training's contract with everything around it: one definition of each name that crosses a
package boundary.

Standard library only, so the charts (which set the environment variables), the operator CLI
(which reads run.json and metrics.jsonl) and the tests import the very names the job uses. A
string typed twice drifts; a name imported from here cannot.

What lives here:

- the ``RAYTRAIN_*`` environment variables the manifests set and the job reads;
- the keys of ``metrics.jsonl`` rows and of ``run.json``;
- the Prometheus metrics the job exports and their label keys;
- the one definition of a steady-state throughput figure (median over the steps, the first
  excluded), used by the loop's run.json summary and by the report;
- the code tree hash: which files travel to the pods and how their content is hashed, used by
  the code archive builder (charts) and by the job itself (what actually ran).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
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
ENV_CACHE_DIR = "RAYTRAIN_CACHE_DIR"
"""Node-local cache of data, tokenizer and model files fetched from S3."""
ENV_CHECKPOINT_LOCAL_DIR = "RAYTRAIN_CHECKPOINT_LOCAL_DIR"
"""Node-local folder where checkpoints are staged before their upload."""
ENV_GIT_COMMIT = "RAYTRAIN_GIT_COMMIT"
"""Git commit of the tree the manifests were synthesized from (empty: not a git checkout)."""
ENV_GIT_DIRTY = "RAYTRAIN_GIT_DIRTY"
"""``true`` when :data:`SOURCE_PATHS` had uncommitted changes at synth, ``false`` when clean."""
ENV_SOURCE_HASH = "RAYTRAIN_SOURCE_HASH"
"""Tree hash of every file that shapes a run (:data:`SOURCE_PATHS`), computed at synth."""
ENV_SPEC_TEXT = "RAYTRAIN_SPEC_B64"
"""The full text of the environment spec the manifests were synthesized from, base64 (UTF-8):
one line keeps the manifest's ``runtimeEnvYAML`` a plain block. ``base64 -d`` reads it."""
ENV_MANIFEST_NAME = "RAYTRAIN_MANIFEST_NAME"
"""The chart (file stem in dist/) of the manifest the pod belongs to, e.g. ``rayjob-local``."""
ENV_HANG_FLOOR_S = "RAYTRAIN_HANG_FLOOR_S"
"""Overrides the progress watchdog's floor (training/watchdog.py ``FLOOR_S``): the shortest time
without a step before a run is declared hung."""
ENV_HANG_FIRST_STEP_S = "RAYTRAIN_HANG_FIRST_STEP_S"
"""Overrides the watchdog's bound for an attempt's first step (``FIRST_STEP_S``): model build,
restore, evaluation before training and the first compile come before it."""
ENV_GATE_DEVICE = "RAYTRAIN_GATE_DEVICE"
"""Test hook of the health gate (training/health_gate.py ``device_readings``): a JSON file whose
``gemm_tflops``, ``gpus`` and ``remapped_rows`` replace the gate's two device calls (the timed GEMM
and nvidia-smi's CSV answers); set on a NODE (its raylet's environment, as a real GPU belongs
to a node), never by a job. Everything after the reading (the decision, the record, keeping the
node out) runs as on a GPU."""
ENV_REPLACEMENT_WAIT_S = "RAYTRAIN_REPLACEMENT_WAIT_S"
"""Overrides how long a run waits, over its life, for its worker group to be placed again
(training/launch.py ``REPLACEMENT_WAIT_S``) before it fails with the node it waited for named."""
ENV_NODE_NAME = "RAYTRAIN_NODE_NAME"
"""The Kubernetes node of the pod (downward API ``spec.nodeName``)."""
ENV_CAPACITY_TYPE = "RAYTRAIN_CAPACITY_TYPE"
"""The pod's node group's capacity (``on-demand``, ``spot``, ``capacity-reservation``, ``capacity-block``)."""
ENV_NODE_PRICE = "RAYTRAIN_NODE_PRICE_PER_HOUR"
"""USD per node-hour of the pod's node group, at the prices the preflight uses (spot: an estimate)."""
ENV_PRICE_LABEL = "RAYTRAIN_PRICE_LABEL"
"""How that price is known: ``list price``, ``spot estimate`` (the spec's or the table's)."""
ENV_ELASTIC_RESIZE_S = "RAYTRAIN_ELASTIC_RESIZE_INTERVAL_S"
"""Seconds between Ray Train's checks for more capacity in an elastic run (tests shorten it)."""
ENV_AZ = "RAYTRAIN_AVAILABILITY_ZONE"
"""The availability zone of a GPU worker pod: the spec's GPU zone, where every GPU node is (the
downward API does not expose node labels such as topology.kubernetes.io/zone)."""
ENV_PREFIX = "RAYTRAIN_"
"""Every variable above starts with this; the driver forwards them to its workers."""

# --- files of a run directory ---------------------------------------------------------------
RECORD_NAME = "run.json"
METRICS_NAME = "metrics.jsonl"
NETCHECK_NAME = "netcheck.json"
"""A netcheck run's record (training/netcheck/__init__.py), beside where run.json would be."""
TENSORBOARD_DIR = "tensorboard"
"""The run's TensorBoard event files (training/metric_sinks/tensorboard.py); copied out with the run."""
ADAPTER_SUFFIX = "-adapter"
"""A LoRA run's peft adapter sits beside its export, ``<export>-adapter`` (``<run>/hf-adapter``:
training/checkpointing/export.py writes it, raytrain_eks/runs/results.py copies it out whole)."""

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
COMPUTE_TOKENS_PER_S = "compute_tokens_per_s"
"""tokens/s over the steps' own time (:data:`COMPUTE_S`): checkpoint, evaluation and report
work left out. :data:`TOKENS_PER_S`, :data:`TFLOPS_PER_DEVICE` and :data:`MFU` are over the
wall-clock :data:`STEP_TIME_S`, which includes them."""
COMPUTE_MFU = "compute_mfu"
"""MFU over the steps' own time, like :data:`COMPUTE_TOKENS_PER_S`."""
WALL_TOKENS_PER_S = "wall_tokens_per_s"
"""run.json: tokens over the whole wall-clock time of the run's steady windows (total over
total, :func:`wall_figure`): the figure a bill pays for."""
WALL_MFU = "wall_mfu"
"""run.json: MFU over the same wall-clock time as :data:`WALL_TOKENS_PER_S`."""
WINDOW_S = "window_s"
"""Wall time since the previous log step (both ends synchronised with the device); the
throughput figures of a row are over this window (on its last row)."""
OVERHEAD_S = "overhead_s"
"""Part of :data:`WINDOW_S` spent outside the steps (checkpoint, evaluation, report)."""
REFUSED = "refused"
"""Summary row key: the one-line reason the run stopped before training (e.g. the transport
gate); the driver fails the run with it instead of letting Ray retry."""
EXPORTED = "exported"
"""Summary row key: where the workers wrote the Hugging Face export."""
EXPORTS = "exports"
"""Summary row key and run.json field: each export the workers wrote, ``{kind: {"uri", "sha256"}}``
(kind ``full``, or ``merged`` and ``peft_adapter`` for a LoRA run; training/checkpointing/export.py)."""
EXPORT_ERROR = "export_error"
"""Summary row key: why the export failed (one line); the run's status is then failed."""
EVAL_LOSS = "eval_loss"
EVAL_PERPLEXITY = "eval_perplexity"

THROUGHPUT_KEYS = (TOKENS_PER_S, TOKENS_PER_S_PER_DEVICE, TFLOPS_PER_DEVICE, MFU, STEP_TIME_S,
                   COMPUTE_TOKENS_PER_S, COMPUTE_MFU)
"""Figures summarised by :func:`steady_median` (run.json ``throughput`` and the report)."""
WALL_KEYS = {WALL_TOKENS_PER_S: TOKENS_PER_S, WALL_MFU: MFU}
"""run.json's wall-clock figures and the row figure each is made of: total over total
(:func:`wall_figure`), never a median, which would hide the checkpoint and evaluation windows."""
STEPS_MEASURED = "steps_measured"
FIGURES = {
    TOKENS_PER_S: "tokens/s of ALL devices over a step's wall-clock time (STEP_TIME_S); run.json: steady_median",
    TOKENS_PER_S_PER_DEVICE: "TOKENS_PER_S / world size; run.json: steady_median",
    COMPUTE_TOKENS_PER_S: "tokens/s of ALL devices over the steps' own time (COMPUTE_S); run.json: steady_median",
    WALL_TOKENS_PER_S: "run.json only: tokens of ALL devices over the whole wall-clock time of the steady windows "
                       "(total over total, wall_figure)",
    TFLOPS_PER_DEVICE: "achieved TFLOP/s of one device over the wall-clock step time; run.json: steady_median",
    MFU: "TFLOPS_PER_DEVICE / the device's peak (ENV_PEAK_TFLOPS); None on CPU; run.json: steady_median",
    COMPUTE_MFU: "MFU over the steps' own time (COMPUTE_S); run.json: steady_median",
    WALL_MFU: "run.json only: MFU over the same time as WALL_TOKENS_PER_S (total over total)",
    STEP_TIME_S: "wall time of one optimizer step; run.json: steady_median",
}
"""One definition per throughput figure: which devices (all or one), over which time (wall-clock
step, compute, whole run) and how run.json summarises it. The Prometheus gauges are per device
(:data:`PROMETHEUS_METRICS`)."""

# --- Prometheus metrics the job exports (ray.util.metrics, served by Ray's metrics agent) ----
# Gauges, one series per rank. Ray's exporter prefixes every user metric with ``ray_``: the
# dashboards query ``PROMETHEUS_PREFIX + name``. No step label: one series per rank, not per step.
PROMETHEUS_PREFIX = "ray_"
LABEL_RUN = "run"
"""The run name (``<storage_path>/<run>`` holds its checkpoints and records)."""
LABEL_JOB = "job_name"
"""The job config's ``name``. Not ``job``: Prometheus sets ``job`` on every target (the scrape
job) and would rename ours to ``exported_job``."""
LABEL_RANK = "rank"
"""World rank of the worker."""
LABEL_NODE = "node"
"""Host name of the worker: the Ray pod's name on EKS (the DCGM exporter's ``pod`` label of the
GPUs it holds), the machine's name locally."""
METRIC_LABELS = (LABEL_RUN, LABEL_JOB, LABEL_RANK, LABEL_NODE)

METRIC_STEP = "raytrain_step"
METRIC_LOSS = "raytrain_loss"
METRIC_LR = "raytrain_learning_rate"
METRIC_GRAD_NORM = "raytrain_grad_norm"
METRIC_TOKENS_PER_S = "raytrain_tokens_per_second_per_device"
METRIC_COMPUTE_TOKENS_PER_S = "raytrain_compute_tokens_per_second_per_device"
METRIC_TFLOPS = "raytrain_tflops_per_device"
METRIC_MFU = "raytrain_mfu"
METRIC_STEP_TIME = "raytrain_step_time_seconds"
METRIC_COMPUTE_TIME = "raytrain_compute_time_seconds"
METRIC_PEAK_MEMORY = "raytrain_peak_memory_bytes"
METRIC_EVAL_LOSS = "raytrain_eval_loss"
METRIC_CHECKPOINT_STALL = "raytrain_checkpoint_stall_seconds"
METRIC_CHECKPOINT_WRITE = "raytrain_checkpoint_write_seconds"

PROMETHEUS_METRICS: dict[str, str] = {
    METRIC_STEP: "Last optimizer step this rank completed.",
    METRIC_LOSS: "Training loss of the last step (token-weighted mean over the global batch).",
    METRIC_LR: "Learning rate of the last step.",
    METRIC_GRAD_NORM: "Gradient norm of the last step, before clipping.",
    METRIC_TOKENS_PER_S: "Tokens per second per device over the last step's wall-clock time.",
    METRIC_COMPUTE_TOKENS_PER_S: "Tokens per second per device over the last step's compute time only.",
    METRIC_TFLOPS: "Achieved training TFLOP/s per device in the last step (wall clock).",
    METRIC_MFU: "Model FLOPs utilisation of the last step, 0..1 (absent on CPU: no peak to compare with).",
    METRIC_STEP_TIME: "Wall time of the last optimizer step, batch fetch included.",
    METRIC_COMPUTE_TIME: "Forward, backward and optimizer time of the last step.",
    METRIC_PEAK_MEMORY: "Peak allocated GPU memory (CPU: peak resident set) of this rank so far.",
    METRIC_EVAL_LOSS: "Held-out loss of the last evaluation.",
    METRIC_CHECKPOINT_STALL: "Seconds the last checkpoint held the training loop.",
    METRIC_CHECKPOINT_WRITE: "Seconds from the last checkpoint's start until it was written and sealed "
                             "(in the background; Ray uploads it afterwards).",
}
"""Every metric the job exports, with its help text."""
EVENT_METRICS = (METRIC_EVAL_LOSS, METRIC_CHECKPOINT_STALL, METRIC_CHECKPOINT_WRITE)
"""Set at an evaluation or a checkpoint, not at every step: a rank serves them only from its
first such event until it exits, which can be seconds."""


def prometheus_name(metric: str) -> str:
    """The name a scrape shows for one of :data:`PROMETHEUS_METRICS`."""
    return PROMETHEUS_PREFIX + metric


# --- a spot node's interruption notice: the one place the stop and grace values derive from ---
SPOT_NOTICE_SECONDS = 120
"""EC2's Spot Instance interruption notice: two minutes between the notice and the reclaim (EC2
User Guide, "Spot Instance interruption notices"). An EKS managed node group drains the node on
it (Kubernetes evicts the Ray pod; ``ray start`` drains its Ray node with the deadline); Ray
Train's PreemptionWatcher sees the drain; the job commits a checkpoint at the next step."""
STOP_MARGIN_SECONDS = 30
"""After a final checkpoint is written a worker still finishes the upload's last request,
reports to the controller and lets ``ray stop`` tear down the raylet; each outer wait is the
inner one plus this margin."""
NOTICE_CHECKPOINT_SECONDS = SPOT_NOTICE_SECONDS - STOP_MARGIN_SECONDS
"""What a checkpoint may take and still fit the notice: ``checkpoint.sigterm_grace_seconds``'s
default, so the worker pods' stop wait (grace + margin) equals the notice."""
RAY_SIGTERM_DRAIN_ENV = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"
"""Ray 2.58 (``ray/_private/node.py`` ``_drain_node_before_shutdown``, default 30 s in
``ray/_private/ray_constants.py``): on SIGTERM ``ray start`` drains its node with deadline now +
this, then kills every process on the node at that deadline, whatever the pod's grace. The
worker pods set it to the checkpoint grace: the drain's deadline is the notice the job sees."""

# --- attempts and cost (training/incidents.py); the incidents themselves: training/incidents.py ---
ATTEMPTS_DIR = "attempts"
"""Under a run: one small JSON per worker-group start and per notice, written by rank 0 (the
driver does not see Ray Train's restarts); the driver turns them into ``incidents``."""
COST = "cost"
"""run.json: node-hours by instance type and capacity type and their price (``raytrain_eks``'s
prices; spot as an estimate), cost per 1M tokens, GPU-minutes lost to incidents."""

# --- run.json -------------------------------------------------------------------------------
RECORD_FIELDS = (
    "schema_version", "run_dir", "kind", "is_infrastructure_check", "image", "image_digest", "code_hash",
    "spec_hash", "manifest_hash", "job_config", "job_config_hash", "cluster", "versions", "hosts", "transport",
    "throughput", "eval", "benchmarks", "objective", "checkpoints", "data", "start_time", "end_time", "duration_s", "status",
    "exit_code", "error", "command", "failure",
    # identity and what ran (the reproducibility review):
    "source", "manifest_name", "environment_spec", "inputs", "ranks", "nccl_logs", "reproducibility",
    "verdict", "definitions", "exports",
    "netcheck",  # the network measured before training (netcheck.run_first): verdict, figures, uri; else None
    "exposed_comm",  # the step's exposed communication, and how it is known (EXPOSED_COMM_LABELS)
    "incidents",  # INCIDENTS: every hang, worker or node loss, failed health check, preemption (training/incidents.py)
    "storage_lives_for_one_submit",  # STORAGE_LIVES_FOR_ONE_SUBMIT: a local run's bucket ends with its submit (no resume)
    "attempts",  # each worker-group start: time, world size, nodes, step resumed from (training/incidents.py)
    "cost",  # node-hours, price, cost per 1M tokens (COST)
)
"""Every top-level key a finished run.json holds."""
EXPOSED_COMM_LABELS = ("measured", "predicted", "unknown")
"""run.json ``exposed_comm.label``: timed by the job; the step model's prediction that ``submit``
handed the run (raytrain_eks/planning/step_model.py, in :func:`run_inputs_uri`'s file); or neither."""
INPUTS_DIR = "_inputs"
"""Under the storage prefix: what ``submit`` hands a run besides its config (raytrain_eks/runs/inputs.py);
not a run's name (run names start with a letter), and nothing inside the run's own directory."""
STEP_PREDICTION = "step_prediction"
"""Key of :func:`run_inputs_uri`'s file: the step model's exposed communication for this run's plan."""


def run_inputs_uri(storage: str, run: str) -> str:
    """``<storage>/_inputs/<run>.json``: the run's inputs as ``submit`` uploaded them."""
    return f"{storage.rstrip('/')}/{INPUTS_DIR}/{run}.json"
WORKER_RECORD_FIELDS = ("versions", "ranks", "inputs", "nccl_logs", "transport", "hosts", "data", "throughput",
                        "eval", "benchmarks", "objective", "checkpoints", "exports")
"""The run.json fields only the workers can read (what ran on the GPU nodes, what they measured).
Rank 0 returns them with its summary; the driver, run.json's only writer, merges them once."""
WORKER_FACTS = "facts"
"""Key of :data:`WORKER_RECORD_FIELDS` in the summary rank 0 returns (``Result.return_value``);
never written to metrics.jsonl."""
INCIDENTS = "incidents"
"""run.json: the list of what went wrong during the run and what it cost (training/incidents.py
:func:`~training.incidents.incident`); the verdict counts them, ``report`` and ``runs`` show them."""
RECORD_STATUSES = ("running", "succeeded", "failed", "stopped")
FAILURE = "failure"
"""run.json: where a failed run failed, e.g. ``{"stage": "data", "rank": 0, "error_class": "DataError"}``."""
FAILURE_STAGE = "stage"
STAGE_DATA = "data"
"""The data could not be read or parsed (a deterministic user error: never retried)."""
STAGE_STOPPED = "stopped"
"""A run stopped on purpose where nothing else sends SIGTERM (a local run: ``raytrain-eks stop``,
or its submit ended): no infrastructure fault, and nothing to resume."""
STORAGE_LIVES_FOR_ONE_SUBMIT_ENV = "RAYTRAIN_STORAGE_LIVES_FOR_ONE_SUBMIT"
"""Set (``1``) by the local backend (raytrain_eks/backends/local.py): the run's storage (moto's S3
in memory) and its Ray head end with the submit, so a stopped run cannot be resumed."""
STORAGE_LIVES_FOR_ONE_SUBMIT = "storage_lives_for_one_submit"
"""run.json: True for such a run (training/launch.py records it; training/verdict.py reads it)."""


# --- the five hashes of a run: run.json key -> what it is the hash of ------------------------
HASHES = {
    "code_hash": "tree_hash of the code archive (CODE_DIRS); 'ran': recomputed by the job from the files that "
                 "ran, 'manifest': the archive the manifest names (ENV_CODE_HASH)",
    "source.hash": "tree_hash of every file that shapes a run (SOURCE_PATHS), taken at synth (ENV_SOURCE_HASH)",
    "spec_hash": "hash of the environment spec the manifests were synthesized from (ENV_SPEC_HASH)",
    "job_config_hash": "job_config_hash() of the resolved job config; 'ran': the job's, 'manifest': its "
                       "label_hash() as the manifest carries it (ENV_JOB_CONFIG_HASH)",
    "manifest_hash": "manifest_hash() of the rendered manifest the pod belongs to (ENV_MANIFEST_HASH)",
}
"""One name and one definition per hash; nothing else in a record is called a hash."""
LABEL_HASH_CHARS = 16
"""Hex digits of a hash in a Kubernetes label value (which takes no ``:``) or a short name."""


def job_config_hash(config: dict[str, Any]) -> str:
    """THE hash of a resolved job config (file + overrides, ``JobConfig.to_dict()``): sha256 of
    its canonical JSON. Equal hashes, equal runs."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def label_hash(full: str) -> str:
    """The first :data:`LABEL_HASH_CHARS` hex digits of a ``sha256:...`` hash (what a manifest's
    label and environment carry; a prefix of the record's whole hash)."""
    return full.removeprefix("sha256:")[:LABEL_HASH_CHARS]


MANIFEST_HASH_PENDING = "manifest-hash-pending"
"""What :data:`ENV_MANIFEST_HASH` holds while a manifest is hashed (:func:`manifest_hash`)."""
_MANIFEST_HASH_VALUE = re.compile(rf"({ENV_MANIFEST_HASH}: )(\S+)")


def manifest_hash(text: str) -> str:
    """THE hash of a rendered manifest: sha256 of its text with the value of
    :data:`ENV_MANIFEST_HASH` replaced by :data:`MANIFEST_HASH_PENDING`, so the hash can be written
    into the very file it describes (no circularity) and recomputed from that file. The charts set
    it; ``raytrain-eks reproduce`` recomputes it from a re-synthesized manifest."""
    blank = _MANIFEST_HASH_VALUE.sub(lambda m: m.group(1) + MANIFEST_HASH_PENDING, text)
    return "sha256:" + hashlib.sha256(blank.encode()).hexdigest()


def fill_manifest_hash(text: str) -> str:
    """``text`` with every :data:`ENV_MANIFEST_HASH` value set to :func:`manifest_hash` of it."""
    digest = manifest_hash(text)
    return _MANIFEST_HASH_VALUE.sub(lambda m: m.group(1) + digest, text)


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
    for key, row_key in WALL_KEYS.items():
        summary[key] = wall_figure(rows, row_key)
    return summary


def wall_figure(rows: list[dict[str, Any]], key: str) -> Any:
    """A wall-clock rate over the run: each log window's rate weighted by its wall time
    (= total tokens / total time), the first window (warm-up) excluded when there are others."""
    windows = [r for r in rows if isinstance(r.get(key), (int, float)) and isinstance(r.get(WINDOW_S), (int, float))]
    steady = windows[1:] or windows
    total = sum(r[WINDOW_S] for r in steady)
    return sum(r[key] * r[WINDOW_S] for r in steady) / total if total > 0 else None


BUCKET_PLACEHOLDER = "{bucket}"
"""Written in a job config string (``s3://{bucket}/models/x``): the charts fill in the
environment's bucket; the job's own checks leave such a path unread."""


# --- the code that travels to the pods -------------------------------------------------------
JOBS_DIR = "jobs"
"""The folder of job configs, in the repository and in the code archive (``--config jobs/<name>.toml``)."""
CODE_DIRS = ("training", JOBS_DIR, "spec_schema")
"""Folders of the repository packed into the code archive; the job's working directory holds
exactly these (spec_schema: the engine that parses the job config)."""
_SKIP_DIRS = frozenset({"__pycache__"})
_SKIP_SUFFIXES = (".pyc", ".pyo")


SOURCE_PATHS = ("training", JOBS_DIR, "spec_schema", "charts", "environment", "requirements.lock", "cdk8s.yaml")
"""Every file that shapes a run, relative to the repository root: the job's code and configs
(what runs), the chart and spec code plus the pinned cdk8s (what renders the manifests). The
environment spec itself is recorded as text; the operator CLI, infra/ (CloudFormation) and
devtools/ do not change what a RayJob runs."""


def source_files(root: str | Path, jobs: str | Path | None = None) -> list[tuple[str, Path]]:
    """``(name, file)`` of :data:`SOURCE_PATHS` under ``root`` (a missing single file is skipped);
    ``jobs`` as in :func:`code_files`."""
    root = Path(root)
    dirs = [p for p in SOURCE_PATHS if (root / p).is_dir() or (p == JOBS_DIR and jobs is not None)]
    files = [(p, root / p) for p in SOURCE_PATHS if (root / p).is_file()]
    return sorted(code_files(root, dirs, jobs) + files)


def code_files(root: str | Path, dirs: Iterable[str] = CODE_DIRS,
               jobs: str | Path | None = None) -> list[tuple[str, Path]]:
    """``(archive name, file)`` of every file under ``root/<dir>`` that travels, sorted by name.

    ``jobs`` (default ``root/jobs``) is the folder that travels as ``jobs/``: the chart tests pack
    fixture copies there, so an edit of a shipped job changes none of their inputs.
    Hidden entries, ``__pycache__``, compiled files and symbolic links stay behind (a folder
    reached through a link is not walked: ``os.walk`` does not follow links); a missing folder is an error
    (an archive without it could not run)."""
    root = Path(root)
    found = []
    for top in dirs:
        base = Path(jobs) if top == JOBS_DIR and jobs is not None else root / top
        if not base.is_dir():
            raise FileNotFoundError(f"{base}: missing (the code archive needs {', '.join(dirs)})")
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
            for filename in filenames:
                path = Path(dirpath, filename)
                # A symbolic link would carry its target, wherever it points, into the archive.
                if filename.startswith(".") or filename.endswith(_SKIP_SUFFIXES) or path.is_symlink() \
                        or not path.is_file():
                    continue
                found.append((f"{top}/{path.relative_to(base).as_posix()}", path))
    return sorted(found)


def tree_hash(files: list[tuple[str, Path]]) -> str:
    """sha256 over each file's archive name, a NUL and the sha256 of its bytes, in name order;
    the first 16 hex. The content decides, not the zip bytes or file times."""
    digest = hashlib.sha256()
    for name, path in sorted(files):
        digest.update(name.encode() + b"\0" + _file_sha256(path))
    return digest.hexdigest()[:16]


def _file_sha256(path: Path, chunk: int = 1 << 20) -> bytes:
    """sha256 of a file read 1 MiB at a time: a model folder's weights are many GB, and reading
    one whole would hold it all in memory."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.digest()


# --- The stop's chain and the run's own time limit -------------------------------------------
# One definition for the charts (pod grace periods, Ray's job-supervisor stop wait) and for the
# job itself (its own wall-clock limit, its exit code), from ``checkpoint.sigterm_grace_seconds``
# and ``rayjob.active_deadline_minutes``.
#
# A stop's chain (``raytrain-eks stop``, a deadline, a RayJob deletion): KubeRay calls StopJob,
# Ray's job supervisor SIGTERMs the driver and SIGKILLs it after ``RAY_JOB_STOP_WAIT_TIME_S``
# (ray 2.58 ``dashboard/modules/job/job_supervisor.py``, default 3 s); the driver passes the stop
# to every worker, they write and commit a final checkpoint within the job's
# ``checkpoint.sigterm_grace_seconds``, the driver writes the record and exits. Each outer wait
# is the inner one plus :data:`STOP_MARGIN_SECONDS`.


def stop_wait_seconds(checkpoint_grace_seconds: int) -> int:
    """How long a stopped job's driver and workers may take after SIGTERM: Ray's job-supervisor
    wait (``RAY_JOB_STOP_WAIT_TIME_S`` in the job's runtime env) and the worker pods'
    terminationGracePeriodSeconds."""
    return checkpoint_grace_seconds + STOP_MARGIN_SECONDS


def head_grace_seconds(checkpoint_grace_seconds: int) -> int:
    """The head pod's terminationGracePeriodSeconds: the stop wait and one more margin. The driver
    runs on the head; when a RayJob is deleted KubeRay calls StopJob and the RayJob's own cluster
    goes at once (KubeRay v1.7.0 rayjob_controller.go:112-138, the finalizer), so the head must
    outlive the stop wait (Kubernetes' default grace is 30 s)."""
    return stop_wait_seconds(checkpoint_grace_seconds) + STOP_MARGIN_SECONDS


def run_time_limit_seconds(active_deadline_minutes: int, checkpoint_grace_seconds: int) -> int:
    """The job's own wall-clock limit, counted from its driver's start: the RayJob's
    ``activeDeadlineSeconds`` less the stop wait, so the final checkpoint is committed before
    that deadline would have KubeRay stop the job. KubeRay counts its deadline from the RayJob's
    start, before the cluster exists, so the job's own limit may end later than KubeRay's; it
    is what stops a ``clusterSelector`` job, which KubeRay only marks failed. At least one minute."""
    return max(60, active_deadline_minutes * 60 - stop_wait_seconds(checkpoint_grace_seconds))


def driver_exit_code(status: str, code: int, time_limit_reached: bool) -> int:
    """The driver's exit code once its run has ended (``status``, ``code``: run.json's): a run
    its OWN time limit stopped (after its final checkpoint) ends cleanly with 0, never the
    stop's 143. KubeRay v1.7.0 retries a RayJob whose driver failed while ``backoffLimit``
    allows (rayjob_controller.go:531-555; only a DeadlineExceeded failure is exempt, :543), so a
    non-zero exit would give the job a second full time limit. A stop from outside (SIGTERM:
    ``raytrain-eks stop``) keeps its code."""
    return 0 if time_limit_reached and status == "stopped" else code
