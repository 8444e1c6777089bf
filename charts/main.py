"""The cdk8s app: environment.toml + jobs/*.toml -> dist/ (``cdk8s synth`` runs this module).

Output, one file per chart (names are stable; the demo and the README rely on them):

- ``dist/raycluster.k8s.yaml``                 the long-lived RayCluster (named after the cluster)
- ``dist/rayjob-<job>.k8s.yaml``               each job on a cluster of its own, deleted after it
- ``dist/rayjob-<job>-on-cluster.k8s.yaml``    each GPU job on the long-lived RayCluster
- ``dist/network-policy.k8s.yaml``             one NetworkPolicy per Ray cluster above (apply first)
- ``dist/code/training-<hash>.zip``            the code archive the RayJobs' working_dir names

``<job>`` is the job config's ``name`` (jobs/local.toml -> ``rayjob-local.k8s.yaml``).

The demo and the local backend read a synthesized RayJob back (:func:`read_rayjob`): they must run
the RayJob's OWN entrypoint and runtime environment, not a copy. That reading imports only
PyYAML, so the demo does not pay for the cdk8s bindings.

Reads files and the environment only here (the edge): ``--env`` or ``$ENV_FILE`` (default
environment.toml), ``--outdir`` or ``$CDK8S_OUTDIR`` (set by the cdk8s CLI; default dist).
``--env A --outdir X --env B --outdir Y`` synthesizes each pair in turn in one process: the
jsii runtime and the bindings load once (seconds on a small build host; the pipeline's Synth
stage, scripts/pipeline/synth.sh, also synthesizes the promoted digest so).
A user error prints ``error: <one line>`` and exits 2.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:  # annotations only: the slow imports stay inside synth
    from charts.code_bundle import CodeBundle
    from charts.jobs import JobPlan
    from charts.provenance import SourceIdentity

ROOT = Path(__file__).resolve().parents[1]
RAYCLUSTER_CHART = "raycluster"
NETWORK_POLICY_CHART = "network-policy"


def rayjob_chart_name(job: str, on_cluster: bool = False) -> str:
    """The chart (and file stem) of a job's RayJob: ``rayjob-<job>[-on-cluster]``."""
    return f"rayjob-{job}{'-on-cluster' if on_cluster else ''}"


@dataclass(frozen=True, kw_only=True, slots=True)
class SynthResult:
    """What one synth wrote."""
    files: dict[str, Path]
    """Chart name -> manifest file."""
    code: "CodeBundle"
    plans: list["JobPlan"]
    source: "SourceIdentity"
    """Git commit, dirty flag, source hash and spec text the RayJobs carry."""
    manifest_hashes: dict[str, str]
    """Chart name -> :func:`training.contract.manifest_hash` of its file (RayJobs only)."""


SUPPORTED_NODE_FLOOR = "20"
"""The oldest Node.js major this project runs cdk8s and cdk on (the Makefile silences the same)."""


def quiet_node_floor_warning() -> None:
    """jsii's Node runtime warns that Node 20 is past its end of life on a line outside its JSON
    protocol, which jsii's Python side prints raw, as ``b'...'``. Silence that one version (the
    variable lists the majors jsii stays quiet for), before the first import of cdk8s starts Node."""
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", SUPPORTED_NODE_FLOOR)


def synth(env, outdir: str | Path, *, root: Path = ROOT, spec_text: str = "",
          jobs: Path | None = None) -> SynthResult:
    """Build the code archive and every chart from ``env`` and ``<jobs>/*.toml`` (default
    ``<root>/jobs``; the folder travels as the archive's ``jobs/``, so tests plan fixture copies
    without touching the shipped jobs); ``spec_text`` (the environment file's text) travels in
    every RayJob for the run record."""
    from charts.jobs import plan_job, plan_jobs
    from charts.code_bundle import build_code_bundle
    from environment.contract import CODE_PREFIX, run_folder
    from charts.provenance import SourceIdentity
    from training.contract import JOBS_DIR

    root = Path(root).resolve()
    jobs = Path(jobs).resolve() if jobs is not None else root / JOBS_DIR
    outdir = Path(outdir).resolve()
    with contextlib.chdir(root):  # job configs name paths relative to where the job runs
        plans = plan_jobs(env, jobs, root)  # user errors surface before the slow imports
        code = build_code_bundle(root, outdir / CODE_PREFIX, jobs)  # dist/ mirrors the bucket's layout
        source = SourceIdentity.capture(root, spec_text, jobs)
        rayjobs = []
        for plan in plans:
            rayjobs.append((rayjob_chart_name(plan.name), plan, False))
            if plan.uses_gpu and plan.node_group == env.primary_gpu_group.name:  # the RayCluster's own group
                # its folder is one the long-lived cluster's role may write (run_folder)
                # (a user override counts as the file's, so it travels first, as synth_run's do)
                run_name = f"checkpoint.run_name={run_folder(plan.config.run_name, on_cluster=True)}"
                on_cluster = plan_job(env, jobs / Path(plan.config_path).name, root, [run_name],
                                      config_path=plan.config_path)
                on_cluster = dataclasses.replace(on_cluster, overrides=(run_name, *on_cluster.overrides))
                rayjobs.append((rayjob_chart_name(plan.name, on_cluster=True), on_cluster, True))
    for stale in (outdir / CODE_PREFIX).glob("training-*.zip"):
        if stale != code.path:
            stale.unlink()
    files, hashes = synth_charts(env, outdir, rayjobs, code=code, source=source, raycluster=True)
    return SynthResult(files=files, code=code, plans=plans, source=source, manifest_hashes=hashes)


def synth_charts(env, outdir: Path, rayjobs: list[tuple[str, "JobPlan", bool]], *, code: "CodeBundle",
                 source: "SourceIdentity", raycluster: bool = False) -> tuple[dict[str, Path], dict[str, str]]:
    """THE cdk8s pipeline, for the whole app (:func:`synth`) and for one run
    (``raytrain_eks.runs.manifest.synth_run``): into ``outdir`` (its old manifests removed), the
    long-lived RayCluster when ``raycluster``, one RayJob per ``(chart name, plan, on the long-lived
    cluster)``, and the NetworkPolicy of every Ray cluster they use; each RayJob's file then
    carries its own manifest hash. Returns (chart name -> file, chart name -> manifest hash of
    the RayJobs)."""
    quiet_node_floor_warning()
    import cdk8s

    from charts.ray_charts import NetworkPolicyChart, RayClusterChart, RayJobChart, cluster_name, raycluster_label, rayjob_label
    from training.contract import fill_manifest_hash, manifest_hash

    for stale in outdir.glob("*.k8s.yaml"):
        stale.unlink()
    app = cdk8s.App(outdir=str(outdir), yaml_output_type=cdk8s.YamlOutputType.FILE_PER_CHART)
    labels = []  # the Ray clusters the charts use, in order, once each
    if raycluster:
        RayClusterChart(app, RAYCLUSTER_CHART, env=env)
        labels.append(raycluster_label(cluster_name(env)))
    for chart, plan, on_cluster in rayjobs:
        target = cluster_name(env) if on_cluster else None
        RayJobChart(app, chart, env=env, plan=plan, code=code, on_cluster=target, source=source)
        labels.append(raycluster_label(target) if target else rayjob_label(plan.name))
    NetworkPolicyChart(app, NETWORK_POLICY_CHART, env=env, cluster_labels=list(dict.fromkeys(labels)))
    app.synth()
    names = ([RAYCLUSTER_CHART] if raycluster else []) + [c.node.id for c in app.charts if c.node.id != RAYCLUSTER_CHART]
    files = {name: outdir / f"{name}.k8s.yaml" for name in names}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise RuntimeError(f"cdk8s wrote no {', '.join(missing)}")  # a bug: file naming changed
    hashes = {}
    for name, path in files.items():
        # Each RayJob carries its own file's hash (the job records it); the others run no job.
        if name not in (RAYCLUSTER_CHART, NETWORK_POLICY_CHART):
            path.write_text(fill_manifest_hash(path.read_text(encoding="utf-8")), encoding="utf-8")
            hashes[name] = manifest_hash(path.read_text(encoding="utf-8"))
    return files, hashes


@dataclass(frozen=True, kw_only=True, slots=True)
class RayJobSubmission:
    """The parts of a RayJob that ``ray job submit`` needs."""
    name: str
    entrypoint: str
    """Exactly the manifest's ``spec.entrypoint`` (a shell command line)."""
    runtime_env_yaml: str
    """Exactly the manifest's ``spec.runtimeEnvYAML``."""
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def runtime_env(self) -> dict[str, Any]:
        return yaml.safe_load(self.runtime_env_yaml) or {}

    @property
    def working_dir(self) -> str:
        return self.runtime_env.get("working_dir", "")


def read_rayjob(manifest: str | Path) -> RayJobSubmission:
    """The one RayJob in ``manifest``; ValueError if there is none or more than one."""
    docs = [d for d in yaml.safe_load_all(Path(manifest).read_text(encoding="utf-8")) if d]
    jobs = [d for d in docs if d.get("kind") == "RayJob"]
    if len(jobs) != 1:
        raise ValueError(f"{manifest}: expected one RayJob, found {len(jobs)}")
    job = jobs[0]
    return RayJobSubmission(
        name=job["metadata"]["name"], entrypoint=job["spec"]["entrypoint"],
        runtime_env_yaml=job["spec"].get("runtimeEnvYAML", ""),
        labels=dict(job["metadata"].get("labels", {})))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m charts.main", description=__doc__.splitlines()[0])
    parser.add_argument("--env", action="append", help="the environment file (repeat with --outdir: one synth each)")
    parser.add_argument("--outdir", action="append", help="where its manifests go (one per --env)")
    parser.add_argument("--root", default=str(ROOT), help="the tree holding training/ and jobs/")
    args = parser.parse_args(argv)
    envs = args.env or [os.environ.get("ENV_FILE", "environment.toml")]
    outdirs = args.outdir or [os.environ.get("CDK8S_OUTDIR", "dist")]
    if len(envs) != len(outdirs):
        parser.error(f"--env given {len(envs)} time(s) and --outdir {len(outdirs)}: one --outdir per --env")
    quiet_node_floor_warning()
    for env_file, outdir in zip(envs, outdirs):
        if code := _synth_one(env_file, outdir, Path(args.root)):
            return code
    return 0


def _synth_one(env_file: str, outdir: str, root: Path) -> int:
    from charts import ChartError
    from environment import SpecError, UnlockedImageWarning, load_environment
    from training.config import JobConfigError

    try:
        env = load_environment(env_file)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UnlockedImageWarning)
            _ = env.image.reference
        for warning in caught:
            print(f"warning: {warning.message}", file=sys.stderr)
        result = synth(env, outdir, root=root, spec_text=Path(env_file).read_text(encoding="utf-8"))
    except (SpecError, ChartError, JobConfigError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, path in result.files.items():
        print(f"{name:<40} {os.path.relpath(path)}")
    print(f"{'code':<40} {os.path.relpath(result.code.path)}  "
          f"(upload to {result.code.uri(env.bucket_name)})")
    identity = result.source
    print(f"{'source':<40} git {identity.git_commit[:12] or 'none (not a git checkout)'}"
          f"{' + uncommitted changes' if identity.dirty else ''}, source hash {identity.source_hash}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
