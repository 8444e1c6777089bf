"""One run's manifests: a job file + ``--set`` overrides + a run name -> its RayJob, the
NetworkPolicy its cluster needs, and the content-addressed code archive both name.

A run is named uniquely (``<job>-<MMDD-HHMMSS>``) unless the user names or resumes one: Ray
Train resumes whatever run directory ``<storage>/<run name>`` already holds, so a reused name
would silently continue an old run from its checkpoint, even after the data changed. The run
name is the RayJob's name (``kubectl get rayjob RUN``), its cluster's network-policy label and
``checkpoint.run_name`` (the run's directory in storage).

The RayJob is synthesized by the charts' own builder (:func:`charts.jobs.plan_job`, the sizing
the preflight checks, and :func:`charts.main.synth_charts`, the app's own pipeline), so a submitted run is exactly
what ``make synth`` writes for that job, plus the run name and the user's overrides in its
entrypoint.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from dataclasses import dataclass
from pathlib import Path

from charts import ChartError
from charts.jobs import MAX_RAYJOB_NAME
from training.storage import RunStorage

ROOT = Path(__file__).resolve().parents[2]
RUN_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
STAMP = "%m%d-%H%M%S"
STAMP_CHARS = len(time.strftime(STAMP)) + 1


@dataclass(frozen=True, kw_only=True, slots=True)
class RunManifests:
    """What :func:`synth_run` wrote for one run."""
    run: str
    job: str
    """The job config's ``name``."""
    rayjob_name: str
    """The RayJob's name: the run's, plus ``-on-cluster`` for a run on the long-lived RayCluster."""
    rayjob: Path
    network_policy: Path
    code_path: Path
    code_uri: str
    storage_uri: str
    """The runs' storage (``Environment.storage_uri``: the bucket's prefix or ``file://<shared path>``)."""
    run_uri: str
    """Where the run's records, checkpoints and model land: ``s3://<bucket>/<prefix>/<run>``, or its
    folder on the spec's shared file system (training/storage/__init__.py)."""
    namespace: str
    region: str
    """The environment's region (the bucket's)."""
    on_cluster: str = ""
    cluster_name: str = ""
    """The EKS cluster's name (a run's Pod Identity association is made there)."""


def check_run_name(name: str, flag: str) -> str:
    """``name`` when it can name a RayJob (and its cluster); else a one-line :class:`ChartError`."""
    if not RUN_NAME.match(name) or len(name) > MAX_RAYJOB_NAME:
        raise ChartError(f"submit: {flag}: {name!r} is not a run name (lowercase letters, digits and '-', "
                         f"starting with a letter, at most {MAX_RAYJOB_NAME} characters: it names the RayJob)")
    return name


def unique_run_name(job: str, now: float | None = None, *, on_cluster: bool = False) -> str:
    """``<job>-<MMDD-HHMMSS>``, the job's name cut so the whole (and an on-cluster RayJob's
    suffix) fits a RayJob name."""
    from environment.contract import ON_CLUSTER_SUFFIX

    stem = job[:MAX_RAYJOB_NAME - STAMP_CHARS - (len(ON_CLUSTER_SUFFIX) if on_cluster else 0)].rstrip("-")
    return f"{stem}-{time.strftime(STAMP, time.gmtime(now))}"


def synth_run(env, job_path: Path, *, run: str, overrides: list[str], outdir: Path, spec_text: str,
              root: Path = ROOT, on_cluster: bool = False) -> RunManifests:
    """Write ``rayjob-<run>.k8s.yaml``, ``network-policy.k8s.yaml`` and the code archive into
    ``outdir``, through the app's own pipeline (:func:`charts.main.synth_charts`)."""
    from charts.code_bundle import build_code_bundle
    from charts.jobs import plan_job
    from charts.main import NETWORK_POLICY_CHART, rayjob_chart_name, synth_charts
    from charts.provenance import SourceIdentity
    from environment.contract import CODE_PREFIX, ON_CLUSTER_SUFFIX, run_folder

    root = Path(root).resolve()
    path = Path(job_path).resolve()
    if not path.is_relative_to(root / "jobs"):
        raise ChartError(f"submit: {job_path}: a job file must be under {root / 'jobs'} "
                         "(it travels to the cluster in the code archive)")
    with contextlib.chdir(root):
        # the storage folder: on the long-lived cluster, one its role may write (run_folder)
        run_overrides = [*overrides, f"checkpoint.run_name={run_folder(run, on_cluster=on_cluster)}"]
        plan = plan_job(env, path, root, run_overrides)
        # The user's overrides go first in the entrypoint, the environment's after them (they win).
        plan = dataclasses.replace(plan, name=run, overrides=(*run_overrides, *plan.overrides))
        code = build_code_bundle(root, outdir / CODE_PREFIX)
        source = SourceIdentity.capture(root, spec_text)
    if on_cluster and not plan.uses_gpu:
        raise ChartError(f"submit: {job_path}: --on-cluster runs GPU jobs on the long-lived RayCluster; "
                         "this job is a CPU job (it brings its own cluster)")
    chart = rayjob_chart_name(run)
    files, _ = synth_charts(env, outdir, [(chart, plan, on_cluster)], code=code, source=source)
    from charts.ray_charts import cluster_name  # only now: it starts jsii, which synth_charts first quiets

    target = cluster_name(env) if on_cluster else ""
    return RunManifests(run=run, job=plan.config.name, rayjob_name=run + (ON_CLUSTER_SUFFIX if target else ""),
                        rayjob=files[chart], network_policy=files[NETWORK_POLICY_CHART],
                        code_path=code.path, code_uri=code.uri(env.bucket_name), storage_uri=env.storage_uri,
                        run_uri=RunStorage(env.storage_uri).run(run_folder(run, on_cluster=bool(target))),
                        namespace=env.ray.namespace, region=env.cluster.region, on_cluster=target,
                        cluster_name=env.cluster.eks_name)


def main(argv: list[str] | None = None) -> int:
    """``python -m raytrain_eks.runs.manifest``: one run's manifests, as ``submit`` writes them
    (``raytrain-eks reproduce`` runs this in the recorded commit's tree)."""
    import argparse
    import sys

    from environment import load_environment

    parser = argparse.ArgumentParser(prog="python -m raytrain_eks.runs.manifest", description=main.__doc__.splitlines()[0])
    parser.add_argument("--env", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--outdir", required=True)
    parser.add_argument("--root", default=str(ROOT))
    parser.add_argument("--on-cluster", action="store_true")
    args = parser.parse_args(argv)
    try:
        written = synth_run(load_environment(args.env), Path(args.root) / args.job, run=args.run,
                            overrides=args.overrides, outdir=Path(args.outdir), root=Path(args.root),
                            spec_text=Path(args.env).read_text(encoding="utf-8"), on_cluster=args.on_cluster)
    except ChartError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(written.rayjob)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
