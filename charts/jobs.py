"""A job config file + the spec -> what its RayJob runs (the entrypoint, its size, its hash).

The job config is parsed by ``training.config.load_job_config``: the very code the job runs, so
a config that synthesizes is one the job accepts. The chart adds ``--set`` overrides for the
facts that belong to the environment, never to the file:

- GPU jobs (``parallel.use_gpu = true`` in the file): the world size and workers per node are
  decided once, by :func:`size_job`, from the spec's GPU group the job names
  (``parallel.node_group``; empty: the first group) and the file's ``parallel.num_workers``
  (absent or 0: every GPU of the group; fewer: a multiple of the GPUs per node, or up to one
  node's GPUs, 1 included); asking for more GPUs than the group has fails synth. The size
  reaches the job as data: :class:`training.config_sections.WorldSize`, typed entry-point arguments.
- CPU jobs (the embedded ``local`` default): keep their own worker count; all of them must fit
  in one worker pod's CPUs.
- every job: ``checkpoint.storage_path`` = the spec's ``s3://<bucket>/<prefix>``; its workers must
  fit the pod and the node (:func:`resource_problems`, below).
- ``{bucket}`` inside any string of the file (e.g. ``model.path = "s3://{bucket}/models/x"``)
  is replaced by the spec's bucket name, so no file retypes a derived name.

The file is read once (:func:`training.config.read_job_file`). Each override is one ``--set`` argument and the entrypoint is ``shlex.join``-ed. The entrypoint
meets a shell twice: KubeRay's submitter runs it inside a bash script, and ``ray job submit``
re-joins its arguments with ``subprocess.list2cmdline`` (which quotes spaces and double quotes
only) for the job supervisor's ``/bin/sh``. A value with a character the second shell would
expand or split on (:data:`SHELL_SPECIAL`) fails synth in one line.
"""
from __future__ import annotations

import json
import shlex
import tomllib
from subprocess import list2cmdline
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from charts import ChartError
from environment import Environment
from environment.cluster import GpuNodeGroupSpec
from environment.addons import SCALE_UP_MINUTES
from training import contract
from training.config import JobConfig, JobConfigError, apply_overrides, job_config_from_dict, read_job_file
from training.config_sections import WorldSize
from training.contract import BUCKET_PLACEHOLDER
from training.model_config import check_model

SHELL_SPECIAL = frozenset("$`'\\!;&|<>(){}*?[]~#\n\r\t")
"""What /bin/sh would expand, split on or choke on after ``list2cmdline`` (see above)."""
MAX_RAYJOB_NAME = 47
"""KubeRay appends 6 characters to a RayJob's name for its cluster (limit 53): 53 - 6."""
GIB = 1024**3
PRE_RUNNING_FACTOR = 3
"""``preRunningDeadlineSeconds`` = this many times the scale-up and image-pull estimate
(:data:`environment.addons.SCALE_UP_MINUTES`): a job whose cluster never gets capacity fails
(``PreRunningDeadlineExceeded``) instead of waiting out ``activeDeadlineSeconds``. KubeRay counts
both deadlines from the same start (the RayJob's ``status.startTime``, set before its cluster is
created) and checks the active one first, so ``rayjob.active_deadline_minutes`` must be longer.
With ``rayjob.backoff_limit`` > 0 KubeRay retries a PreRunningDeadlineExceeded (only
DeadlineExceeded is never retried): a job that never gets capacity waits up to
(backoff_limit + 1) x this deadline."""


def pre_running_deadline_seconds() -> int:
    return int(PRE_RUNNING_FACTOR * SCALE_UP_MINUTES * 60)


@dataclass(frozen=True, kw_only=True, slots=True)
class JobPlan:
    """One job config, resolved against one environment."""
    name: str
    """RayJob name (the job config's ``name``)."""
    config_path: str
    """The config, relative to the job's working directory (the unpacked code archive)."""
    config: JobConfig
    """The config as the job will see it (with the chart's overrides)."""
    overrides: tuple[str, ...]
    """``key=value`` items, each passed as ``--set ITEM``."""
    world: WorldSize | None
    """A GPU job's size (:func:`size_job`), passed after the overrides; None for a CPU job."""
    node_group: str
    """The GPU node group its workers run on."""

    @property
    def worker_replicas(self) -> int:
        """Worker pods of the job's own cluster (a CPU job's workers share one)."""
        return self.world.worker_pods if self.world else 1

    @property
    def uses_gpu(self) -> bool:
        return self.config.parallel.use_gpu

    @property
    def entrypoint(self) -> str:
        argv = ["python", "-m", "training", "--config", self.config_path]
        for item in self.overrides:
            argv += ["--set", item]
        return shlex.join(argv + (self.world.argv() if self.world else []))

    @property
    def config_hash(self) -> str:
        """Hash of the effective config (file + overrides): equal hashes, equal runs."""
        return contract.label_hash(contract.job_config_hash(self.config.to_dict()))

    @property
    def grace_seconds(self) -> int:
        return self.config.checkpoint.sigterm_grace_seconds


def _toml_value(value: Any) -> str:
    """An override value the job's ``--set`` parser reads back unchanged: a string that would
    parse as another TOML type (``true``, ``8``) is quoted, plain words stay readable."""
    if isinstance(value, str):
        try:
            tomllib.loads(f"v = {value}")
        except tomllib.TOMLDecodeError:
            return value
        return json.dumps(value)
    return json.dumps(value)  # numbers and booleans: TOML spells them as JSON does


def survives_ray_job_submit(arg: str) -> bool:
    """Whether ``arg`` reaches the job unchanged after ``ray job submit`` re-quotes it for a shell."""
    return not set(arg) & SHELL_SPECIAL and shlex.split(list2cmdline([arg])) == [arg]


def _placeholders(raw: dict[str, Any], bucket: str, prefix: str = "") -> list[str]:
    found = []
    for key, value in raw.items():
        if isinstance(value, dict):
            found += _placeholders(value, bucket, f"{prefix}{key}.")
        elif isinstance(value, str) and BUCKET_PLACEHOLDER in value:
            found.append(f"{prefix}{key}={_toml_value(value.replace(BUCKET_PLACEHOLDER, bucket))}")
    return found


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def size_job(group: GpuNodeGroupSpec, parallel: dict[str, Any], rel: str, where: str) -> WorldSize | None:
    """THE world size of a GPU job on its node group: the file's ``parallel.num_workers`` (0 or
    absent: every GPU of the group), in worker pods of ``min(num_workers, GPUs per node)`` GPUs,
    so a job of one GPU up to one node's is one pod and a larger one takes whole nodes. More GPUs
    than the group has, a size that is neither, or more workers per node than the node has GPUs
    is one :class:`ChartError` line. None where the file's value is not a count at all: the
    schema names it."""
    requested, per_node = parallel.get("num_workers", 0), parallel.get("workers_per_node")
    if _int(per_node) and per_node > group.gpus_per_node:
        raise ChartError(f"{rel}: parallel.workers_per_node: {per_node} is more than the {group.gpus_per_node} GPUs of "
                         f"one node (one worker per GPU; the charts size it to the node): {where}")
    if not _int(requested) or requested < 0:
        return None
    workers = requested or group.world_size
    if workers > group.world_size:
        raise ChartError(f"{rel}: parallel.num_workers: {requested} asks for more GPUs than the cluster has: {where}")
    if workers > group.gpus_per_node and workers % group.gpus_per_node:
        raise ChartError(f"{rel}: parallel.num_workers: {requested} must be a multiple of the GPUs per node, or at most "
                         f"one node's {group.gpus_per_node}: {where}")
    return WorldSize(num_workers=workers, workers_per_node=min(workers, group.gpus_per_node))


def resource_problems(env: Environment, job: JobConfig, *, host_model_bytes: int = 0) -> list[str]:
    """Why the job's workers cannot run on ``env``'s worker pods ([] when they fit): ONE function,
    used by the charts at synth (:func:`plan_job`) and by the preflight, so the two can never
    disagree. Each problem is one line: ``<file>: <field>: <value> ... (what fits)``.

    Where the job's Ray workers run, in the group its ``parallel.node_group`` names (empty: the
    first group):

    - a GPU job: one worker pod per node, holding the node's GPUs and EFA interfaces and the pod's
      CPUs and memory (environment/instances.py: what is left after the node's own reserve); each
      pod runs ``parallel.workers_per_node`` Ray workers, one GPU each;
    - a CPU job (``use_gpu = false``): all its workers in ONE worker pod of the GPU group.

    ``host_model_bytes``: the full model in host memory, built once by EVERY worker before
    FSDP shards it (0 = unknown: the charts do not know the model's size)."""
    group = env.gpu_group(job.parallel.node_group)
    p, s = job.parallel, job.source
    pod = f"one worker pod ({group.pod_cpu} CPUs on {group.instance_type})"
    problems = []
    if not p.use_gpu:
        cpus = p.num_workers * p.cpus_per_worker
        if cpus > group.pod_cpu:
            problems.append(f"{s}: parallel.num_workers: {p.num_workers} x cpus_per_worker {p.cpus_per_worker} = "
                            f"{cpus:g} CPUs do not fit {pod}")
        per_pod = p.num_workers
    else:
        if p.workers_per_node > group.gpus_per_node:
            problems.append(f"{s}: parallel.workers_per_node: {p.workers_per_node} workers of one GPU each do not "
                            f"fit a {group.instance_type} ({group.gpus_per_node} GPUs)")
        cpus = p.workers_per_node * p.cpus_per_worker
        if cpus > group.pod_cpu:
            problems.append(f"{s}: parallel.cpus_per_worker: {p.cpus_per_worker:g} x workers_per_node "
                            f"{p.workers_per_node} = {cpus:g} CPUs do not fit {pod}")
        if job.evidence.require_transport == "efa" and group.efa_per_node < 1:
            problems.append(f"{s}: evidence.require_transport: 'efa' but {group.instance_type} has no EFA interface")
        per_pod = p.workers_per_node
    host = per_pod * host_model_bytes
    if host > group.pod_memory_gib * GIB:
        problems.append(f"{s}: parallel.workers_per_node: {per_pod} workers each build the full model on the host "
                        f"before sharding: {per_pod} x {host_model_bytes / GIB:.1f} GiB = {host / GIB:.1f} GiB > "
                        f"{group.pod_memory_gib} GiB of one worker pod ({group.instance_type})")
    return problems


def plan_job(env: Environment, path: Path, root: Path, user_overrides: tuple[str, ...] | list[str] = (),
             *, config_path: str | None = None) -> JobPlan:
    """Resolve one job config file against the environment: THE sizing of a job, used by the
    charts (which synthesize it) and by the preflight (which checks it), so both see one shape.

    ``root`` is the directory the job runs in (the archive's root = the repository root) and
    must be the current directory: the config's relative paths (data, tokenizer) are checked
    from there, as the job will resolve them. ``user_overrides`` (the preflight's ``--set``)
    count as part of the file; the environment's overrides come after them and win.
    ``config_path`` is where the file lies in the code archive, what the entrypoint names
    (default: its path relative to ``root``)."""
    if Path.cwd().resolve() != root.resolve():
        raise RuntimeError(f"plan_job must run in {root} (is in {Path.cwd()})")  # a bug in the caller
    resolved = path.resolve()
    rel = resolved.relative_to(root.resolve()).as_posix() if resolved.is_relative_to(root.resolve()) else str(path)
    user_overrides = list(user_overrides)
    try:
        raw = read_job_file(rel, user_overrides)  # the one read of the file; the rest builds from this table
    except JobConfigError as err:
        raise ChartError(str(err)) from None
    # A GPU job is sized by the spec, so validate it at that size (e.g. hybrid_shard needs the
    # spec's >= 2 nodes; the file alone says nothing about nodes).
    parallel = raw.get("parallel", {}) if isinstance(raw.get("parallel", {}), dict) else {}
    gpu_job = parallel.get("use_gpu") is True
    group_name = parallel.get("node_group", "")
    try:
        group = env.gpu_group(group_name if isinstance(group_name, str) else "")
    except KeyError:
        known = ", ".join(g.name for g in env.gpu_node_groups)
        raise ChartError(f"{rel}: parallel.node_group: {group_name!r} is not a GPU node group of {env.source} "
                         f"(known: {known})") from None
    where = (f"the spec's GPU group {group.name!r} has {group.world_size} = {group.job_nodes} nodes x "
             f"{group.gpus_per_node} GPUs ({group.instance_type}, {env.source})")
    world = size_job(group, parallel, rel, where) if gpu_job else None
    if world:
        world.apply(raw)
    try:
        base = job_config_from_dict(raw, rel)
    except JobConfigError as err:
        raise ChartError(f"{err}{f' (at the spec size: {world})' if world else ''}") from None
    name = base.name
    if not name[0].isalpha() or len(name) > MAX_RAYJOB_NAME:
        raise ChartError(f"{rel}: name: {name!r} is not a RayJob name (starts with a letter, "
                         f"at most {MAX_RAYJOB_NAME} characters: KubeRay appends 6 for its cluster)")
    overrides: list[str] = []
    if world and base.measures_network:  # the verdict's link: the instance table's figure (one definition)
        overrides.append(f"netcheck.link_gbps={group.instance.network_gbps}")
    problems = resource_problems(env, base)
    if problems:
        raise ChartError(problems[0])
    active, pre_running = base.rayjob.active_deadline_minutes * 60, pre_running_deadline_seconds()
    if active <= pre_running:
        raise ChartError(f"{rel}: rayjob.active_deadline_minutes: {base.rayjob.active_deadline_minutes} is not longer "
                         f"than the {pre_running / 60:g} minutes the job's cluster may take to come up "
                         "(preRunningDeadlineSeconds, counted from the same start): the job would be killed "
                         "before its cluster is up")
    ttl, scale_up = base.rayjob.ttl_seconds_after_finished, int(SCALE_UP_MINUTES * 60)
    if env.queueing.enabled and ttl + scale_up > pre_running:
        # Kueue frees a job's quota when it ends (its Workload is Finished) and admits the next,
        # whose pods then wait for this job's cluster to go (KubeRay deletes it ttl seconds after
        # the end) while the next job's preRunningDeadlineSeconds runs.
        raise ChartError(f"{rel}: rayjob.ttl_seconds_after_finished: {ttl} keeps the ended job's cluster, and its "
                         f"nodes, longer than the next queued job can wait for them: it is admitted as this job "
                         f"ends and must be running within {pre_running / 60:g} minutes (preRunningDeadlineSeconds), "
                         f"a scale-up (~{SCALE_UP_MINUTES:g} min) included: at most {pre_running - scale_up}")
    written = base.checkpoint.storage_path
    if written and written.rstrip("/") != env.storage_uri:
        # The cluster's runs live in the spec's bucket; a path in the file would be replaced silently.
        raise ChartError(f"{rel}: checkpoint.storage_path: {written!r} is set by the charts to the spec's "
                         f"{env.storage_uri} on the cluster (a local directory is not shared between pods): "
                         "remove it from the file")
    try:
        check_model(base, read_s3=False, local_tokenizer=False)
    except JobConfigError as err:
        raise ChartError(str(err)) from None
    overrides.append(f"checkpoint.storage_path={_toml_value(env.storage_uri)}")
    overrides += _placeholders(raw, env.bucket_name)
    try:
        config = job_config_from_dict(apply_overrides(raw, overrides, rel), rel)
    except JobConfigError as err:
        raise ChartError(f"{err} (with the spec's overrides: {' '.join(overrides)})") from None
    entry = config_path or rel
    for item in [entry, *overrides]:
        if not survives_ray_job_submit(item):
            key, value = item.split("=", 1) if item is not entry else ("config path", item)
            special = " ".join(sorted(SHELL_SPECIAL - set("\n\r\t")))
            raise ChartError(f"{rel}: {key}: {value!r} cannot reach the job: ray job submit hands the entrypoint "
                             f"to a shell again, so it may not contain any of {special} or a tab or line break")
    return JobPlan(name=name, config_path=entry, config=config, overrides=tuple(overrides), world=world,
                   node_group=group.name)


def plan_jobs(env: Environment, jobs_dir: Path, root: Path) -> list[JobPlan]:
    """Every ``*.toml`` under ``jobs_dir``, sorted; two files with one name are refused. The
    folder travels as the archive's ``jobs/`` (:func:`charts.code_bundle.build_code_bundle`),
    so each entrypoint names ``jobs/<file>`` wherever the folder lies here."""
    plans = [plan_job(env, p, root, config_path=f"{contract.JOBS_DIR}/{p.name}")
             for p in sorted(jobs_dir.glob("*.toml"))]
    seen: dict[str, str] = {}
    for plan in plans:
        if plan.name in seen:
            raise ChartError(f"{plan.config_path}: name: {plan.name!r} is already used by {seen[plan.name]}")
        seen[plan.name] = plan.config_path
    return plans
