"""`make demo`: the main job on the embedded local default, end to end, on this machine.

What it does, in order (each step prints a header):
1. prints the environment (``raytrain-eks summary``);
2. synthesizes the CloudFormation templates (``cdk synth``, skipped with ``--skip-cdk``) and the
   manifests (``cdk8s synth``), and validates the manifests against the real KubeRay CRDs;
3. runs preflight for the ``local`` job;
4. runs the job locally, as ``raytrain-eks submit --local`` does (raytrain_eks/backends/local.py):
   moto's S3-compatible server on 127.0.0.1 stands in for the checkpoint bucket (same name as
   the spec derives) and receives the code archive the manifest names; a real Ray head on
   127.0.0.1 gets the ``local`` RayJob's OWN entrypoint and runtimeEnvYAML, read from the
   synthesized manifest (not a copy), with ``ray job submit`` (what KubeRay's submitter does on
   EKS), while the node's metrics endpoint is scraped every 2 s (as Prometheus scrapes the Ray
   pods on EKS);
5. copies the run's records and its exported model out of the bucket (raytrain_eks/runs/results.py),
   renders the report (Markdown + PNG), prints where everything is, eval before/after, the
   scraped metrics beside metrics.jsonl, and the verdict.
Everything it started is stopped on exit, also on Ctrl-C or failure.

``--fault`` (``make demo FAULT=1``) kills one worker from outside, as a real fault arrives: once
Ray Train has registered the job's first checkpoint (its snapshot in the bucket names it) and
``metrics.jsonl`` in the bucket holds step :func:`fault_step`, the demo SIGKILLs one
``RayTrainWorker`` process (its pid from Ray's state API). Until then the bucket (moto behind the
throttling layer of devtools/slow_store.py) holds the upload of the next checkpoint at 16 KiB/s
(devtools/strike.py), so the run can neither save that checkpoint nor end before the kill, on any
machine. Ray Train restarts the workers, the run resumes from the first checkpoint, redoes the
steps after it, and run.json records the incident (``worker_lost``: which rank, the step resumed
from, the steps and the minutes lost). The submitted command and runtime env stay byte-identical
to the manifest: nothing of the job knows about the fault.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NODE_BIN = ROOT / "node_modules" / ".bin"
LOCAL_JOB = "local"


def fault_step(job) -> int:
    """Where ``--fault`` kills a worker: once the last step before the job's second checkpoint
    whose metrics reach storage (a ``train.report_every_n_steps`` step) is in the bucket. The run
    resumes from the first checkpoint and redoes steps that are already on record, so the two can
    be compared."""
    every, report, last = job.checkpoint.every_n_steps, job.train.report_every_n_steps, job.train.max_steps
    # the last step's metrics reach storage only with the run's end, which the held upload prevents
    synced = [step for step in range(every + 1, min(2 * every, last)) if step % report == 0] if every > 0 else []
    if not synced:
        raise DemoError(f"jobs/{LOCAL_JOB}.toml: --fault needs a reported step (train.report_every_n_steps = {report}) "
                        f"after the first checkpoint (checkpoint.every_n_steps = {every}), before the second one and "
                        f"before the last step (train.max_steps = {last})")
    return synced[-1]


class DemoError(RuntimeError):
    """A step failed; the message says which and where to look."""


def _header(step: int, total: int, text: str) -> None:
    print(f"\n==> [{step}/{total}] {text}", flush=True)


def _tool_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
           "CDK_DISABLE_CLI_TELEMETRY": "true", "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    env.update(extra or {})
    return env


def _run(cmd: list[str], what: str, *, env: dict[str, str] | None = None, quiet: bool = False) -> None:
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=_tool_env(env), text=True,
                          stdout=subprocess.PIPE if quiet else None, stderr=subprocess.STDOUT if quiet else None)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout or "").strip().splitlines()[-15:])
        raise DemoError(f"{what} failed (exit {proc.returncode}){': ' + tail if tail else ''}")
    print(f"    {what}: ok ({time.monotonic() - start:.1f} s)", flush=True)


def run_demo(args: argparse.Namespace) -> dict:
    from charts.main import read_rayjob
    from raytrain_eks.verify import render_summary
    from devtools.metrics_scrape import Watcher
    from raytrain_eks.backends.local import run_local
    from devtools.slow_store import slow_store
    from environment import load_environment
    from training.checkpointing.manager import checkpoint_dir_name

    total = 5
    env_path = Path(args.env)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the summary prints the unlocked-image warning itself
        env = load_environment(env_path)
        _header(1, total, "environment")
        print(render_summary(env), flush=True)

    _header(2, total, "synthesize and validate")
    spec_env = {"ENV_FILE": str(env_path.resolve())}
    from infra.build import deployability_problem

    not_deployable = deployability_problem(env)
    if args.skip_cdk:
        print("    cdk synth: skipped (--skip-cdk)")
    elif not_deployable:
        # The CloudFormation of a spec that cannot be deployed proves nothing; the local job
        # below needs only the manifests. What to set comes from the same check `cdk synth` runs.
        print(f"    cdk synth: skipped, the spec is not deployable yet: {not_deployable}")
    else:
        _run([str(NODE_BIN / "cdk"), "synth", "--quiet"], "cdk synth (CloudFormation -> cdk.out/)", env=spec_env, quiet=True)
    dist = (ROOT / args.dist).resolve()  # relative to the repository, like the tools it runs
    _run([str(NODE_BIN / "cdk8s"), "synth", "--no-check-upgrade", "--output", str(dist)],
         f"cdk8s synth (manifests -> {args.dist}/)", env=spec_env, quiet=True)
    _run([sys.executable, "-m", "charts.validate", str(dist)], "validate manifests (KubeRay CRDs, Kubernetes schema)", quiet=True)

    _header(3, total, "preflight")
    _run([sys.executable, "-m", "raytrain_eks.cli", "preflight", "--env", str(env_path), "--job", f"jobs/{LOCAL_JOB}.toml",
          "--dist", str(dist)],
         "preflight", quiet=False)

    manifest = dist / f"rayjob-{LOCAL_JOB}.k8s.yaml"
    job = read_rayjob(manifest)
    from environment.contract import CODE_PREFIX
    from training.config import load_job_config

    code_zip = dist / CODE_PREFIX / Path(job.working_dir).name
    local_job = load_job_config(ROOT / "jobs" / f"{LOCAL_JOB}.toml")
    run_uri = f"{env.storage_uri}/{local_job.run_name}"
    out_dir = Path(args.out) if args.out else ROOT / ".work" / "demo" / time.strftime("%Y%m%d-%H%M%S")

    _header(4, total, "local run: moto's S3 server and a real Ray head on 127.0.0.1 (both stop with the demo); "
                      f"ray job submit of the '{job.name}' RayJob's own entrypoint and runtimeEnvYAML "
                      f"({manifest})")
    watchers: list = []
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(slow_store(None)) if args.fault else None
        if args.fault:
            at = fault_step(local_job)
            print(f"    FAULT: once {checkpoint_dir_name(local_job.checkpoint.every_n_steps)} is registered and "
                  f"step {at} is in the bucket, the demo SIGKILLs one worker process (from outside the job; "
                  f"the next checkpoint's upload is held until then); Ray Train restarts the workers from the "
                  f"last checkpoint")

        @contextlib.contextmanager
        def while_running(head):
            # Scrape the node's metrics endpoint while the job runs, as Prometheus does on EKS.
            watchers.append(Watcher(head.metrics_url, run=local_job.run_name))
            try:
                with watchers[-1], (_strike(store, head, local_job, run_uri) if args.fault else contextlib.nullcontext()):
                    yield
            except AssertionError as err:  # the fault did not strike (devtools/strike.py says why)
                raise DemoError(f"--fault: {err}") from None

        ran = run_local(rayjob=manifest, run_uri=run_uri, code_path=code_zip, out_dir=out_dir,
                        while_running=while_running, storage=store)
    _header(5, total, "results")
    _print_scrape(watchers[0], out_dir)
    if ran.status != "SUCCEEDED":
        raise DemoError(f"the job did not succeed ({ran.status}); its records are in {out_dir}")
    return _finish(out_dir, ran.info, job)


def _strike(store, head, job, run_uri: str):
    """``--fault``: SIGKILL one Ray Train worker process once the first checkpoint is registered and
    step :func:`fault_step` is in the bucket, the next checkpoint's upload held until then
    (devtools/strike.py)."""
    from devtools.strike import Strike, logged_step, ray_train_workers, registered
    from raytrain_eks.runs.results import s3_client
    from training.checkpointing.manager import checkpoint_dir_name

    s3, every, at = s3_client(store.client_env), job.checkpoint.every_n_steps, fault_step(job)
    saved, held = checkpoint_dir_name(every), checkpoint_dir_name(min(2 * every, job.train.max_steps))

    def kill() -> int:
        worker = ray_train_workers(head.dashboard_url, head.auth_token)[-1]
        os.kill(worker.pid, signal.SIGKILL)
        print(f"    FAULT: SIGKILL to worker pid {worker.pid} (after {saved} was registered and step {at} "
              f"reached the bucket)", flush=True)
        return worker.pid

    return Strike(store, held=f"/{job.run_name}/{held}/", fault=kill, what=f"{saved} and step {at}",
                  ready=lambda: registered(s3, run_uri) == saved and logged_step(s3, run_uri) >= at)


def _print_scrape(watcher, out_dir: Path) -> None:
    """The job's metrics as the node's endpoint served them (last scrape), beside metrics.jsonl;
    the last scrape is also kept as ``metrics-scrape.json``."""
    from devtools.metrics_scrape import report

    metrics_file = out_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()] \
        if metrics_file.is_file() else []
    print("    Prometheus metrics " + "\n    ".join(report(watcher, rows)))
    (out_dir / "metrics-scrape.json").write_text(json.dumps(
        {rank: {name: {"labels": s.labels, "value": s.value} for name, s in series.items()}
         for rank, series in watcher.last.items()}, indent=2, sort_keys=True) + "\n")


def _finish(out_dir: Path, info: dict, job) -> dict:
    from raytrain_eks.runs.report import eval_before_after, load_run
    from raytrain_eks.runs.results import finish

    code = finish(out_dir)
    run = load_run(str(out_dir))
    before, after = eval_before_after(run)
    record = run.record
    resumed = [a for a in record.get("attempts", []) if a.get("resumed_from")] if isinstance(record.get("attempts"), list) else []
    if resumed:
        print(f"    resumed after the fault from {resumed[-1].get('resumed_from')}")
    same = info["entrypoint"] == job.entrypoint
    print(f"    command that ran == manifest entrypoint: {same}")
    print(f"    reproduce: raytrain-eks reproduce {out_dir}   |   all runs: raytrain-eks runs {out_dir.parent}")
    return {"out_dir": str(out_dir), "before": before, "after": after, "entrypoint_identical": same,
            "status": record.get("status"), "verdict": (record.get("verdict") or {}).get("verdict"), "exit_code": code}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default=os.environ.get("ENV_FILE", "environment.toml"))
    parser.add_argument("--fault", action="store_true", default=os.environ.get("FAULT", "") not in ("", "0"))
    parser.add_argument("--skip-cdk", action="store_true", help="do not synthesize the CloudFormation templates")
    parser.add_argument("--dist", default="dist", help="where the manifests and the code archive are synthesized (default dist)")
    parser.add_argument("--out", default="", help="where the run's records and report go (default .work/demo/<time>)")
    args = parser.parse_args(argv)
    # Ctrl-C and SIGTERM unwind through the context managers, which stop Ray and the S3 server.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    start = time.monotonic()
    try:
        run_demo(args)
    except KeyboardInterrupt:
        print("\ndemo: interrupted; everything it started has been stopped", file=sys.stderr)
        return 130
    except DemoError as err:
        print(f"\ndemo: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # user errors from environment/job config are one line too
        from environment import SpecError
        from training.config import JobConfigError
        if isinstance(err, (SpecError, JobConfigError)):
            print(f"demo: error: {err}", file=sys.stderr)
            return 2
        raise
    print(f"\ndemo: done in {time.monotonic() - start:.0f} s; nothing left running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
