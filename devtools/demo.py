"""`make demo`: the main job on the embedded local default, end to end, on this machine.

What it does, in order (each step prints a header):
1. prints the environment (``raytrain-eks summary``);
2. synthesizes the CloudFormation templates (``cdk synth``, skipped with ``--skip-cdk``) and the
   manifests (``cdk8s synth``), and validates the manifests against the real KubeRay CRDs;
3. runs preflight for the ``local`` job;
4. starts local checkpoint storage: moto's S3-compatible server on 127.0.0.1 (in memory; stands
   in for the checkpoint bucket, same bucket name as the spec derives) and uploads the code
   archive the manifest names;
5. starts a real Ray head on 127.0.0.1;
6. submits the ``local`` RayJob's OWN entrypoint and runtimeEnvYAML, read from the synthesized
   manifest (not a copy), with ``ray job submit`` — what KubeRay's submitter does on EKS;
7. copies the run directory (run.json, metrics, checkpoints' index) out of the bucket, renders
   the report (Markdown + PNG) and prints where everything is, with eval before/after, and the
   job's Prometheus metrics as the node's metrics endpoint served them during the run (scraped
   every 2 s, as Prometheus scrapes the Ray pods on EKS), beside metrics.jsonl.
Everything it started is stopped on exit, also on Ctrl-C or failure.

``--fault`` (``make demo FAULT=1``) makes one worker die mid-run (through the training
package's fault hook, set in the Ray cluster's environment, so the submitted command and runtime
env stay byte-identical to the manifest) and the run resumes from its last checkpoint.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
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
FAULT_STEP = 15
"""Where ``--fault`` kills a worker: after the step-10 checkpoint, before the step-20 one."""


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


def _upload(s3_env: dict[str, str], local: Path, uri: str) -> None:
    import boto3

    bucket, _, key = uri.removeprefix("s3://").partition("/")
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name=s3_env["AWS_DEFAULT_REGION"],
                          aws_access_key_id="local", aws_secret_access_key="local")
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    client.upload_file(str(local), bucket, key)


def _download_run(s3_env: dict[str, str], run_uri: str, dest: Path) -> list[str]:
    """Copy a run's records (not the checkpoint shards) out of the in-memory bucket."""
    import boto3

    bucket, _, prefix = run_uri.removeprefix("s3://").partition("/")
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name=s3_env["AWS_DEFAULT_REGION"],
                          aws_access_key_id="local", aws_secret_access_key="local")
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
        keys += [o["Key"] for o in page.get("Contents", [])]
    wanted = [k for k in keys if k.endswith((".json", ".jsonl", ".md", ".txt", ".log")) and "/checkpoint" not in k
              and "__" not in Path(k).name]
    for key in wanted:
        target = dest / key[len(prefix.rstrip("/")) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, key, str(target))
    return keys


def submit_command(dashboard_url: str, submission_id: str, entrypoint: str, runtime_env_yaml: str) -> list[str]:
    """``ray job submit`` for a RayJob's own entrypoint and runtime env, as KubeRay's submitter
    builds it. Ray re-joins the arguments after ``--`` with shlex.join, so splitting the
    manifest's (shlex-joined) entrypoint gives back the very same string."""
    import yaml

    runtime_env = yaml.safe_load(runtime_env_yaml) or {}
    return [str(BIN / "ray"), "job", "submit", "--no-wait", "--address", dashboard_url, "--submission-id", submission_id,
            "--runtime-env-json", json.dumps(runtime_env), "--", *shlex.split(entrypoint)]


def submit_and_follow(dashboard_url: str, submission_id: str, entrypoint: str, runtime_env_yaml: str,
                      *, auth_env: dict[str, str], attempts: int = 30) -> int:
    """Submit (retrying while the head's job agent is still registering, as KubeRay's submitter
    does), then stream the job's logs until it ends. Returns 0 when the job SUCCEEDED.
    ``auth_env``: the head's ``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN`` (KubeRay injects the same
    two into its submitter)."""
    # (Ray re-joins the words after `--` with shlex.join: the job's entrypoint is the manifest's.)
    env = _tool_env(auth_env)
    cmd = submit_command(dashboard_url, submission_id, entrypoint, runtime_env_yaml)
    for attempt in range(attempts):
        proc = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True)
        if proc.returncode == 0:
            break
        if "No available agent" not in proc.stdout + proc.stderr or attempt == attempts - 1:
            raise DemoError(f"ray job submit failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
        time.sleep(2)
    subprocess.run([str(BIN / "ray"), "job", "logs", "--follow", "--address", dashboard_url, submission_id],
                   cwd=ROOT, env=env)
    return 0 if _job_info(dashboard_url, submission_id, auth_env)["status"] == "SUCCEEDED" else 1


def run_demo(args: argparse.Namespace) -> dict:
    from charts.manifests import read_rayjob
    from raytrain_eks.commands.summary import render as render_summary
    from devtools.local_services import ray_head, s3_server
    from devtools.metrics_scrape import Watcher
    from environment import load_environment

    total = 7
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
    _run([str(NODE_BIN / "cdk8s"), "synth", "--no-check-upgrade"], "cdk8s synth (manifests -> dist/)", env=spec_env, quiet=True)
    _run([sys.executable, "-m", "charts.validate", "dist"], "validate manifests (KubeRay CRDs, Kubernetes schema)", quiet=True)

    _header(3, total, "preflight")
    _run([sys.executable, "-m", "raytrain_eks.cli", "preflight", "--env", str(env_path), "--job", f"jobs/{LOCAL_JOB}.toml"],
         "preflight", quiet=False)

    manifest = ROOT / "dist" / f"rayjob-{LOCAL_JOB}.k8s.yaml"
    job = read_rayjob(manifest)
    from environment.contract import CODE_PREFIX
    from training.config import load_job_config

    code_zip = ROOT / "dist" / CODE_PREFIX / Path(job.working_dir).name
    run_uri = f"{env.storage_uri}/{load_job_config(ROOT / 'jobs' / f'{LOCAL_JOB}.toml').run_name}"
    out_dir = Path(args.out) if args.out else ROOT / ".work" / "demo" / time.strftime("%Y%m%d-%H%M%S")

    _header(4, total, "local checkpoint storage: moto's S3 server on 127.0.0.1 (in memory, stops with the demo)")
    with s3_server() as s3:
        _upload(s3.client_env, code_zip, job.working_dir)
        print(f"    {s3.endpoint_url}: bucket {env.bucket_name}, code {job.working_dir}")
        worker_env = dict(s3.client_env)
        if args.fault:
            # Set on the Ray cluster (like a chaos tool would), not in the job: the submitted
            # command and runtime env stay exactly the manifest's.
            worker_env.update(RAYTRAIN_FAULT_AT_STEP=str(FAULT_STEP), RAYTRAIN_FAULT_RANK="1")
        _header(5, total, "local Ray head on 127.0.0.1")
        with ray_head(num_cpus=4, env=worker_env, keep_logs=out_dir / "ray-logs") as head:
            print(f"    dashboard {head.dashboard_url}, metrics {head.metrics_url}")
            _header(6, total, f"ray job submit: the '{job.name}' RayJob's own entrypoint and runtimeEnvYAML ({manifest.relative_to(ROOT)})")
            print(f"    entrypoint: {job.entrypoint}", flush=True)
            if args.fault:
                print(f"    FAULT: rank 1 dies after step {FAULT_STEP}; Ray Train restarts the workers from the last checkpoint")
            submission_id = f"{job.name}-{int(time.time())}"
            # Scrape the node's metrics endpoint while the job runs, as Prometheus does on EKS.
            with Watcher(head.metrics_url) as watcher:
                returncode = submit_and_follow(head.dashboard_url, submission_id, job.entrypoint, job.runtime_env_yaml,
                                               auth_env=head.client_env)
            info = _job_info(head.dashboard_url, submission_id, head.client_env)
            _header(7, total, "results")
            out_dir.mkdir(parents=True, exist_ok=True)
            _download_run(s3.client_env, run_uri, out_dir)
            _print_scrape(watcher, out_dir)
            if returncode != 0:
                raise DemoError(f"the job did not succeed ({info['status']}); its records are in {out_dir}")
    return _finish(out_dir, info, job)


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


def _job_info(dashboard_url: str, submission_id: str, auth_env: dict[str, str]) -> dict:
    from ray.job_submission import JobSubmissionClient

    # The token goes in the request's own header: Ray's client reads RAY_AUTH_MODE once per
    # process and caches it, so an environment set after anything imported Ray is not seen.
    token = auth_env.get("RAY_AUTH_TOKEN", "")
    headers = {"authorization": f"Bearer {token}"} if token else None
    info = JobSubmissionClient(dashboard_url, headers=headers).get_job_info(submission_id)
    return {"submission_id": submission_id, "status": getattr(info.status, "value", str(info.status)),
            "entrypoint": info.entrypoint}


def _finish(out_dir: Path, info: dict, job) -> dict:
    from raytrain_eks.report import eval_before_after, load_run, render_report

    (out_dir / "ray_job.json").write_text(json.dumps(
        {**info, "manifest_entrypoint": job.entrypoint, "manifest_runtime_env_yaml": job.runtime_env_yaml}, indent=2) + "\n")
    report = render_report([str(out_dir)], out_dir / "report")
    run = load_run(str(out_dir))
    before, after = eval_before_after(run)
    record = run.record
    print(f"    run.json:  {out_dir / 'run.json'}  (status {record.get('status')})")
    print(f"    metrics:   {out_dir / 'metrics.jsonl'}")
    print(f"    report:    {report}  (+ PNG plots beside it)")
    if before is not None and after is not None:
        print(f"    held-out loss before {before:.4f} -> after {after:.4f}")
    resumed = [a for a in record.get("attempts", []) if a.get("resumed_from")] if isinstance(record.get("attempts"), list) else []
    if resumed:
        print(f"    resumed after the fault from {resumed[-1].get('resumed_from')}")
    same = info["entrypoint"] == job.entrypoint
    print(f"    command that ran == manifest entrypoint: {same}")
    from training.verdict import headline

    print(f"    verdict:   {headline(record.get('verdict'))}")
    print(f"    reproduce: raytrain-eks reproduce {out_dir}   |   all runs: raytrain-eks runs {out_dir.parent}")
    return {"out_dir": str(out_dir), "before": before, "after": after, "entrypoint_identical": same,
            "status": record.get("status"), "verdict": (record.get("verdict") or {}).get("verdict")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default=os.environ.get("ENV_FILE", "environment.toml"))
    parser.add_argument("--fault", action="store_true", default=os.environ.get("FAULT", "") not in ("", "0"))
    parser.add_argument("--skip-cdk", action="store_true", help="do not synthesize the CloudFormation templates")
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
