"""`raytrain-eks submit JOB`: one command from a job file to the verdict.

First everything that can be known before spend is checked (:func:`check_before_spend`), and
the job's own local files are planned to travel with the run (raytrain_eks/runs/inputs.py). Then it
synthesizes that job's RayJob under a new, unique run name (``<job>-<MMDD-HHMMSS>``; ``--name``
to choose one, ``--resume RUN`` to continue a run from its last checkpoint), uploads the
content-addressed code archive when the bucket lacks it, applies the run's NetworkPolicy when
missing, applies the RayJob and follows it: its place in Kueue's queue while it waits there
(raytrain_eks/backends/kueue_queue.py), pods waiting for nodes and images, then the driver's log (each logged step's loss, tokens/s and ETA, evaluations, checkpoints). At the end
it copies run.json, the metrics, the logs and the exported model out of storage into
``--out`` (default ``.work/runs/<run>``), renders the report, prints the verdict and exits
with its code (0 accepted, 3 rejected, 1 execution-failed, 4 no verdict; 2 bad input). Runs on
a shared file system (``storage.shared_path``, training/storage/__init__.py) are handed their inputs
and read back at that path, so it must be mounted where submit runs.

On EKS, Ctrl-C detaches: the run goes on (``raytrain-eks status/logs/stop RUN``).
``--local`` runs it on this machine instead (a real Ray head and moto's S3 server on
127.0.0.1, as ``make demo`` does); there Ctrl-C stops the run with the services.

`raytrain-eks netcheck` (:class:`Netcheck`) is submit with its job fixed: jobs/netcheck.toml.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from raytrain_eks.runs import inputs as run_inputs
from raytrain_eks.runs.results import finish_netcheck
from training.contract import NETCHECK_NAME
from training.storage import RunStorage

DEFAULT_POLL_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="job config under jobs/, e.g. jobs/finetune-qwen2.5-1.5b.toml")
    parser.add_argument("--env", default="environment.toml", help="environment spec (default environment.toml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one job field for this run, e.g. --set train.max_steps=200 (repeatable)")
    names = parser.add_mutually_exclusive_group()
    names.add_argument("--name", default="", metavar="RUN", help="name the new run (default <job>-<MMDD-HHMMSS>)")
    names.add_argument("--resume", default="", metavar="RUN", help="continue this run from its last checkpoint")
    parser.add_argument("--local", action="store_true",
                        help="run on this machine: a Ray head and moto's S3 server on 127.0.0.1 (the embedded local default)")
    parser.add_argument("--on-cluster", action="store_true", help="EKS: run on the long-lived RayCluster (GPU jobs)")
    parser.add_argument("--out", default="", help="where the run's results go (default .work/runs/<run>)")
    parser.add_argument("--no-wait", action="store_true",
                        help="EKS: return once the RayJob is applied (raytrain-eks status/logs RUN follow it)")
    parser.add_argument("--poll-seconds", type=float, default=DEFAULT_POLL_S, help=argparse.SUPPRESS)


def _job_name(job: Path, overrides: list[str]) -> str:
    from raytrain_eks.runs.manifest import ROOT
    from training.config import load_job_config

    with contextlib.chdir(ROOT):
        return load_job_config(job, overrides).name


def auto_plan(env, job: Path, overrides: list[str]) -> list[str]:
    """A GPU job with ``parallel.plan = "auto"``: the plan search's pick as ``--set`` overrides
    (raytrain_eks/planning/preflight.py ``auto_plan_overrides``), printed; they travel in the
    RayJob's entrypoint like any other. [] for any other job."""
    from charts.jobs import plan_job
    from raytrain_eks.planning.preflight import auto_plan_overrides
    from raytrain_eks.runs.manifest import ROOT

    with contextlib.chdir(ROOT):
        config = plan_job(env, job.resolve(), ROOT, list(overrides)).config
    # The user's --set come after these overrides and win: a plan setting they set is pinned for
    # the search, else the job run would mix the user's setting with a pick made without it.
    config = _pin_user_plan_settings(config, overrides)
    sets = auto_plan_overrides(env, config)
    if sets:
        print(f"plan: parallel.plan = 'auto' runs the plan search's pick: {' '.join(sets)}")
    return sets


def _pin_user_plan_settings(config, overrides: list[str]):
    """``config`` with every plan setting an ``--set`` names added to ``parallel.pinned``."""
    import dataclasses

    from training.config_checks import PLAN_SETTINGS

    keys = {item.split("=", 1)[0].strip() for item in overrides}
    named = [n for n in PLAN_SETTINGS if (f"train.{n}" if n == "micro_batch_size" else f"parallel.{n}") in keys]
    if not named:
        return config
    pinned = tuple(dict.fromkeys([*config.parallel.pinned, *named]))
    return dataclasses.replace(config, parallel=dataclasses.replace(config.parallel, pinned=pinned))


def check_before_spend(env, job: Path, overrides: list[str], *, local: bool) -> list:
    """Everything that can be known before a node scales up or a Ray head starts: the job config
    at the environment's size (charts.jobs.plan_job), the model's config.json and every data file
    it can read, local or S3 with ``{bucket}`` filled in (the preflight's own checks: world size,
    pods, transport, memory), and on EKS that kubectl talks to this environment's cluster. The
    first problem is one :class:`ChartError` line. Returns the inputs that travel with the run
    (:mod:`raytrain_eks.runs.inputs`)."""
    from charts import ChartError
    from charts.jobs import plan_job
    from raytrain_eks.planning.preflight import run_preflight
    from raytrain_eks.runs.manifest import ROOT

    with contextlib.chdir(ROOT):
        config = plan_job(env, job.resolve(), ROOT, list(overrides)).config
        plan = run_preflight(env, config, dist_dir=ROOT / "dist", cdk_out=ROOT / "cdk.out")
    if plan.refusal:
        raise ChartError(f"submit: {plan.refusal} (raytrain-eks preflight {job} shows the whole plan)")
    inputs = [c for c in plan.checks if c.name in ("model", "data")]
    print("checked: " + "; ".join(f"{c.name}: {c.message}" for c in inputs))
    if not local:
        from raytrain_eks.backends.eks import check_context

        check_context(env.cluster.eks_name)
    storage = RunStorage(env.storage_uri)
    if storage.kind == "shared" and not os.path.isdir(storage.path):
        raise ChartError(f"{env.source}: storage.shared_path: {storage.path!r} is not a directory on this machine: "
                         "submit hands the run its inputs and reads its results there (mount the file system "
                         "here, or leave storage.shared_path empty for the bucket)")
    return run_inputs.plan_uploads(config, env.bucket_uri, ROOT), step_prediction(plan)


CLAIM_NAME = ".submit.lock"


def claim_results_folder(out_dir: Path, run_name: str, *, local: bool, resume: bool) -> int:
    """One submit per run and results folder on this machine, before anything is written or
    spent: an exclusive ``flock`` of ``<out>/.submit.lock`` held for the submit's life (the
    returned descriptor; the kernel releases it when the process ends, however it ends), so a second concurrent submit of the run is
    one line, not a traceback from the two writing one folder. And ``--local``: the run's storage
    lives for one submit, so the results folder is the record of a finished run, and a ``--name``
    whose folder holds a ``run.json`` is refused (docs/submit.md: a name storage already holds is
    refused) instead of overwriting it."""
    import fcntl

    from charts import ChartError

    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir / CLAIM_NAME, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ChartError(f"submit: run {run_name}: another submit of this run is running on this machine (it holds "
                         f"{out_dir / CLAIM_NAME}): wait for it, or pick another --name") from None
    if local and not resume and (out_dir / "run.json").is_file():
        os.close(fd)
        raise ChartError(f"submit --local: --name {run_name}: {out_dir / 'run.json'} already holds a run of that name "
                         "(a local run's storage lives for one submit: this folder is its record): pick another "
                         "--name, or leave --name out for a fresh one")
    return fd


def step_prediction(plan) -> dict | None:
    """The step model's exposed communication for the preflight's plan (run.json's
    ``exposed_comm``, handed to the run in ``_inputs/<run>.json``); None where the preflight has
    no step range (a CPU job, a plan without a measured trace)."""
    from raytrain_eks.planning.step_model import exposed_comm

    predicted = (plan.measured or {}).get("range")
    return exposed_comm(predicted) if predicted else None


def run(args: argparse.Namespace) -> int:
    from charts import ChartError
    from environment import load_environment
    from raytrain_eks.runs.manifest import ROOT, check_run_name, synth_run, unique_run_name

    # The user's paths are from the user's directory: anchor them before anything runs in ROOT.
    job = Path(args.job).absolute()
    if not job.is_file():
        raise ChartError(f"submit: {args.job}: no such job file (the jobs are in {ROOT / 'jobs'})")
    args.env, args.out = str(Path(args.env).absolute()), args.out and str(Path(args.out).absolute())
    if args.local and (args.resume or args.on_cluster):
        flag = "--resume" if args.resume else "--on-cluster"
        raise ChartError(f"submit --local: {flag}: the local run's storage and cluster live for one submit only "
                         "(moto's S3 in memory, a Ray head of its own)")
    if args.local and args.no_wait:
        raise ChartError("submit --local: --no-wait: a local run lives as long as its submit "
                         "(its Ray head and storage stop with it); raytrain-eks status/logs/stop RUN reach it meanwhile")
    env = load_environment(args.env)
    args.overrides = [*auto_plan(env, job, args.overrides), *args.overrides]  # the user's --set win
    uploads, prediction = check_before_spend(env, job, args.overrides, local=args.local)
    run_name = (check_run_name(args.resume, "--resume") if args.resume else check_run_name(args.name, "--name")
                if args.name else unique_run_name(_job_name(job, args.overrides), on_cluster=args.on_cluster))
    out_dir = Path(args.out) if args.out else ROOT / ".work" / "runs" / run_name
    claim = claim_results_folder(out_dir, run_name, local=args.local, resume=bool(args.resume))
    try:
        manifests = synth_run(env, job, run=run_name, overrides=[*args.overrides, *run_inputs.overrides(uploads)],
                              outdir=out_dir / "manifests",
                              spec_text=Path(args.env).read_text(encoding="utf-8"), on_cluster=args.on_cluster)
        print(f"run {run_name}: {'resumes' if args.resume else 'new'}, job {manifests.job}, storage {manifests.run_uri}")
        print(f"    RayJob {manifests.rayjob}")
        run_inputs.write_record(uploads, out_dir)
        if args.local:
            return _local(manifests, out_dir, uploads, env.bucket_uri, prediction)
        try:
            return _eks(manifests, out_dir, uploads, env.bucket_uri, prediction, resume=bool(args.resume), poll_s=args.poll_seconds,
                        wait=not args.no_wait)
        except KeyboardInterrupt:
            print(f"\nsubmit: detached; the run goes on. raytrain-eks status {run_name} | logs {run_name} | stop {run_name}",
                  file=sys.stderr)
            return 130
    finally:
        os.close(claim)  # the lock goes with it


def _local(manifests, out_dir: Path, uploads: list, storage_uri: str, prediction: dict | None = None) -> int:
    from raytrain_eks.backends.local import run_local
    from raytrain_eks.runs.results import finish

    ran = run_local(rayjob=manifests.rayjob, run_uri=manifests.run_uri, code_path=manifests.code_path, out_dir=out_dir,
                    prepare=lambda client: run_inputs.upload(client, uploads, storage_uri, manifests.run,
                                                             prediction=prediction,
                                                             run_storage=manifests.storage_uri))
    if NETCHECK_NAME in ran.copied and "run.json" not in ran.copied:  # a netcheck job (not a run_first)
        return finish_netcheck(out_dir)
    if "run.json" not in ran.copied:
        # Ray's word for a job that exits non-zero is FAILED, also for a run the verdict rejects:
        # it is shown only when there is no record (and so no verdict) to speak instead.
        print(f"submit: {manifests.run} ended before it wrote its record (the Ray job {ran.status.lower()}): "
              f"raytrain-eks logs {manifests.run}; Ray's own logs: {out_dir / 'ray-logs'}", file=sys.stderr)
        return 1
    print(f"==> {manifests.run}: ended; its record, report and model in {out_dir}")
    return finish(out_dir)


def _refuse_a_live_sibling(manifests, *, resume: bool) -> None:
    """A run's two variants (``RUN`` on its own cluster, ``RUN-on-cluster`` on the long-lived
    one): while one is live, the other may not start. They write different folders
    (``<storage>/RUN`` and ``<storage>/on-cluster_RUN``, environment.contract.run_folder), but
    ``status``, ``logs`` and ``stop`` find a run by its name, which would then name two."""
    from charts import ChartError
    from environment.contract import ON_CLUSTER_SUFFIX
    from raytrain_eks.backends import eks

    sibling = manifests.run if manifests.on_cluster else manifests.run + ON_CLUSTER_SUFFIX
    found = eks.get_rayjob(sibling, manifests.namespace)
    if found is not None and eks.phase(found)[0] not in eks.TERMINAL:
        deployment, job_status = eks.phase(found)
        raise ChartError(f"submit: {'--resume' if resume else '--name'}: RayJob {sibling} is {deployment}"
                         f"{' / ' + job_status if job_status else ''} under the same run name {manifests.run!r}: "
                         f"raytrain-eks stop {manifests.run} first")


def _eks(manifests, out_dir: Path, uploads: list, storage_uri: str, prediction: dict | None = None, *, resume: bool,
         poll_s: float, wait: bool = True) -> int:
    from charts import ChartError
    from raytrain_eks.backends import eks
    from raytrain_eks.backends.kueue_queue import QueueWatch
    from raytrain_eks.backends.eks import release_after_deadline
    from raytrain_eks.runs.results import run_exists, s3_client, upload_if_missing

    client = s3_client(region=manifests.region)
    exists = run_exists(client, manifests.run_uri)
    if resume and not exists:
        raise ChartError(f"submit: --resume: {manifests.run!r} has nothing in {manifests.run_uri} to resume "
                         "(raytrain-eks list shows the runs)")
    if not resume and exists:
        raise ChartError(f"submit: --name: {manifests.run_uri} already holds a run: it would resume it "
                         f"(say so with --resume {manifests.run}, or choose another name)")
    _refuse_a_live_sibling(manifests, resume=resume)
    existing = eks.get_rayjob(manifests.rayjob_name, manifests.namespace)
    if existing is not None and not resume:
        # Server-side apply onto it would succeed and change nothing that runs: KubeRay does not
        # run a finished RayJob again (rayjob_controller.go:420-447), and a live one is someone's run.
        deployment, job_status = eks.phase(existing)
        raise ChartError(f"submit: --name: RayJob {manifests.rayjob_name} already exists ({deployment}"
                         f"{' / ' + job_status if job_status else ''}): raytrain-eks stop {manifests.run}, "
                         "or choose another name")
    if existing is not None and eks.phase(existing)[0] not in eks.TERMINAL:
        # Deleting it stops its Ray job (the finalizer), but its cluster goes in the background
        # (owner references): its workers could still write checkpoints beside the new attempt.
        deployment, job_status = eks.phase(existing)
        raise ChartError(f"submit: --resume: RayJob {manifests.rayjob_name} is still {deployment}"
                         f"{' / ' + job_status if job_status else ''}: raytrain-eks stop {manifests.run} first")
    # The refusals above come before anything is written: nothing of a refused submit is uploaded.
    if upload_if_missing(client, manifests.code_path, manifests.code_uri):
        print(f"    code archive uploaded: {manifests.code_uri}")
    else:
        print(f"    code archive already in the bucket: {manifests.code_uri}")
    run_inputs.upload(client, uploads, storage_uri, manifests.run, prediction=prediction,
                      run_storage=manifests.storage_uri)
    eks.apply_policy_if_missing(str(manifests.network_policy), manifests.namespace, print)
    if not manifests.on_cluster:
        _run_identity(manifests, out_dir)
    if existing is not None:
        # A RayJob's spec cannot be re-run in place: the old one goes, its storage stays.
        # Foreground: wait until its own cluster (a controller reference) is gone too.
        eks.kubectl("delete", "rayjob", manifests.rayjob_name, "-n", manifests.namespace,
                    "--cascade=foreground", "--wait=true")
    eks.apply(str(manifests.rayjob))
    if not wait:
        print(f"    RayJob {manifests.rayjob_name} applied; raytrain-eks status {manifests.run} | logs {manifests.run} -f")
        return 0
    print(f"    RayJob {manifests.rayjob_name} applied (Ctrl-C detaches; the run goes on)")
    final = eks.follow(manifests.rayjob_name, manifests.namespace, poll_s=poll_s,
                       queue_line=QueueWatch(manifests.rayjob_name, manifests.namespace).line)
    if final is None:  # stopped: its storage holds what it wrote (a stop keeps the final checkpoint)
        return _results(client, manifests, out_dir, "stopped (RayJob deleted)")
    deployment, job_status = eks.phase(final)
    if release_after_deadline(manifests.rayjob_name, manifests.namespace, final, print):
        print(f"    submit --resume {manifests.run} continues it (with a longer rayjob.active_deadline_minutes)")
    if deployment == "ValidationFailed":
        # KubeRay refused the spec before creating anything (rayjob_controller.go:144-161): no
        # cluster ran, so storage has nothing of it; the RayJob stays until deleted.
        raise ChartError(f"submit: KubeRay refused RayJob {manifests.rayjob_name}: "
                         f"{(final.get('status') or {}).get('message', '')} (raytrain-eks stop {manifests.run} removes it)")
    return _results(client, manifests, out_dir, f"{deployment}{' / ' + job_status if job_status else ''}")


def _run_identity(manifests, out_dir: Path) -> None:
    """The run's own service account and its Pod Identity association with the run role
    (raytrain_eks/backends/eks.py), made with the operator's rights before the RayJob."""
    import boto3
    import yaml

    from raytrain_eks.backends import eks

    cluster = manifests.cluster_name
    path = out_dir / "manifests" / f"serviceaccount-{manifests.run}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(eks.run_service_account(manifests.run, manifests.namespace)), encoding="utf-8")
    eks.apply(str(path))
    account, partition = eks.caller_account(boto3.client("sts", region_name=manifests.region))
    eks.ensure_run_identity(eks.eks_api(manifests.region), cluster=cluster, namespace=manifests.namespace,
                            run=manifests.run, role=eks.run_role_arn(cluster, account, partition))


def _release_identity(manifests) -> None:
    """The run's association goes once its pods are gone (a later --resume makes a new one)."""
    from raytrain_eks.backends import eks

    if not manifests.on_cluster:
        eks.release_run_identity(eks.eks_api(manifests.region), cluster=manifests.cluster_name,
                                 namespace=manifests.namespace, run=manifests.run,
                                 role=eks.caller_run_role(manifests.cluster_name, manifests.region))


def _results(client, manifests, out_dir: Path, ended: str) -> int:
    """Copy what the run wrote to storage and exit with its verdict's code; 1 without a record."""
    from raytrain_eks.runs.results import download_run, finish

    print(f"==> {manifests.run}: {ended}")
    copied = download_run(client, manifests.run_uri, out_dir)
    _release_identity(manifests)
    if NETCHECK_NAME in copied and "run.json" not in copied:
        return finish_netcheck(out_dir)
    if "run.json" not in copied:
        print(f"submit: the run wrote no run.json to {manifests.run_uri} (raytrain-eks logs {manifests.run})",
              file=sys.stderr)
        return 1
    return finish(out_dir)


class Netcheck:
    """`raytrain-eks netcheck`: the network measured under control (jobs/netcheck.toml, submitted
    as any job is: ``submit``'s path, its checks before spend, its RayJob on the GPU node group).

    Prints the bus bandwidth table (NCCL as configured vs forced to sockets), writes
    ``netcheck.png`` beside ``netcheck.json`` in ``--out`` and exits with the verdict's code (0
    accepted, 3 rejected, 1 a run failed). ``--local``: on this machine's CPUs with gloo (2
    workers, 1-4 MiB), the whole path without a GPU: the figures, the record, the verdict."""

    JOB = "jobs/netcheck.toml"
    LOCAL_SETS = ("parallel.use_gpu=false", "parallel.num_workers=2", "parallel.workers_per_node=2",
                  "netcheck.max_bytes=4194304", "netcheck.iters=5", "evidence.require_transport=any")
    """A local netcheck: gloo on two CPU workers of one node, small messages (the figures measure
    this machine's loopback, not a network; the path is what is proven)."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_arguments(parser)
        parser.set_defaults(job=Netcheck.JOB)
        for action in parser._actions:  # the job is fixed: JOB becomes an optional argument
            if action.dest == "job":
                action.nargs, action.help = "?", f"the netcheck job (default {Netcheck.JOB})"

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        if args.local:
            args.overrides = [*Netcheck.LOCAL_SETS, *args.overrides]
        return run(args)
