"""The walk-through's world, shared by the walk-through tests: a workspace whose committed
environment.toml names the local registry, the AWS side of the pipeline stack in moto's server,
the fake kubectl (fake_kubectl.py, KubeRay v1.7.0) on PATH, and each pipeline execution's stages
run as the buildspecs run them (``scripts/pipeline/synth.sh``, ``python -m raytrain_eks.pipeline``),
each build with its own ``CODEBUILD_BUILD_NUMBER`` as CodeBuild numbers builds."""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import boto3
import yaml

from environment import load_environment
from environment.queueing import kueue_objects
from fixtures_pipeline import create_watcher_resources
from infra.lambdas.image_watcher.history import PromotionHistory
from infra.lambdas.image_watcher.promote import read_record
from infra.lambdas.image_watcher.watcher import CodePipelineStarter, WatcherConfig, check

REPO = Path(__file__).resolve().parents[3]
NAME = "deep-learning-containers/ray"


def make_walk(tmp_path: Path, aws: dict, registry, real_run: Path, *, starter_status=None):
    """A workspace (environment.toml on the local registry), the AWS side of the pipeline stack
    in moto (the runs bucket versioned, as the storage stack makes it; the failure topic with a
    queue subscribed, to read what a person would be sent), the fake kubectl on PATH, and the
    smoke record ``real_run`` (a folder with run.json and metrics.jsonl) that the fake "trains".
    ``starter_status``: the execution status the watcher reads (moto runs no actions)."""
    suffix = uuid.uuid4().hex[:8]
    tag = f"walk-{suffix}"
    text = (REPO / "environment.toml").read_text()
    text = text.replace('repository = "public.ecr.aws/deep-learning-containers/ray"',
                        f'repository = "{registry.host}/{NAME}"')
    text = text.replace('tag = "train-ml-cuda-v1.1.0"', f'tag = "{tag}"')
    text = text.replace('name = "raytrain"', f'name = "walk{suffix}"', 1)
    work = tmp_path / "ws"
    work.mkdir()
    (work / "committed.toml").write_text(text)  # what the repository holds (git)
    env = load_environment(work / "committed.toml")
    assert env.image.tag == tag and env.image.repository.startswith(registry.host)

    ssm, ddb, cp, s3, sns, sqs = (boto3.client(s, **aws) for s in
                                  ("ssm", "dynamodb", "codepipeline", "s3", "sns", "sqs"))
    s3.create_bucket(Bucket=env.bucket_name)
    s3.put_bucket_versioning(Bucket=env.bucket_name, VersioningConfiguration={"Status": "Enabled"})
    topic = sns.create_topic(Name=f"failures-{suffix}")["TopicArn"]
    queue = sqs.create_queue(QueueName=f"inbox-{suffix}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"})
    parameter, table, pipeline = f"/raytrain/walk-{suffix}/promoted", f"promotions-{suffix}", f"redeploy-{suffix}"
    create_watcher_resources(aws, SimpleNamespace(parameter_name=parameter, table_name=table, pipeline_name=pipeline))

    kube = tmp_path / "kube"
    kube.mkdir()
    # the cluster as deployed: Kueue's objects when the add-on installs it (environment/queueing.py)
    kueue = {"kueue": {"objects": kueue_objects(env)}} if env.queueing.enabled else {}
    (kube / "state.json").write_text(json.dumps({"clusters": {}, "rayjobs": {}, **kueue}))
    (kube / "kubectl").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).parent / "fake_kubectl.py"}" "$@"\n')
    (kube / "kubectl").chmod(0o755)

    class Walk:
        pass

    w = Walk()
    w.env, w.work, w.kube, w.s3, w.ssm = env, work, kube, s3, ssm
    config = WatcherConfig(repository=env.image.repository, tag=tag, parameter_name=parameter,
                           table_name=table, pipeline_name=pipeline)
    w.history = PromotionHistory(client=ddb, table_name=table, image=config.image)
    starter = CodePipelineStarter(cp, pipeline)
    if starter_status is not None:
        starter = starter_status(starter)
    w.starter = starter
    w.watch = lambda: check(config, ssm=ssm, history=w.history, starter=starter)

    def notifications() -> list[str]:
        """What the failure topic delivered since the last call (a person's inbox)."""
        out = []
        while True:
            got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", [])
            if not got:
                return out
            for m in got:
                out.append(m["Body"])
                sqs.delete_message(QueueUrl=queue, ReceiptHandle=m["ReceiptHandle"])

    w.notifications = notifications
    w.push_image = lambda content: registry.push_image(NAME, tag, content=content)
    w.promoted = lambda: ssm.get_parameter(Name=parameter)["Parameter"]["Value"]
    # Generous bounds: every wait ends on its event (a terminal RayJob, a ready cluster);
    # only a cluster that never gets ready waits this long.
    w.environ = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{kube}:{os.environ['PATH']}",
                 "FAKE_KUBE_DIR": str(kube), "AWS_ENDPOINT_URL": aws["endpoint_url"],
                 "AWS_DEFAULT_REGION": aws["region_name"], "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "HISTORY_TABLE": table,
                 "PROMOTED_DIGEST_PARAMETER": parameter, "POLL_SECONDS": "0.05", "TIMEOUT_SECONDS": "300",
                 "PYTHON": sys.executable, "NOTIFY_TOPIC_ARN": topic}
    builds = itertools.count(1)  # CodeBuild numbers each build; a retried stage is a new build

    def scenario(**values):
        (kube / "scenario.json").write_text(json.dumps({"run_source": str(real_run), **values}))

    def applied(kind="RayCluster"):
        path = kube / "applied.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
        return [r for r in rows if r["kind"] == kind]

    def live_images():
        state = json.loads((kube / "state.json").read_text())
        pods = state["clusters"][env.cluster.name]["pods"]
        return {c["imageID"].rsplit("@", 1)[-1] for p in pods for c in p["status"]["containerStatuses"]}

    class Execution:
        """One pipeline execution: its own workspace (artifacts), its stages callable one by one."""

        def __init__(self, execution: str, requested: str):
            self.id, self.requested, self.dir = execution, requested, work / execution
            self.digest = self.record = ""
            self.results: dict[str, subprocess.CompletedProcess] = {}

        def step(self, name: str, *args: str) -> subprocess.CompletedProcess:
            done = subprocess.run([sys.executable, "-m", "raytrain_eks.pipeline", name, *args], cwd=self.dir,
                                  env={**w.environ, "EXECUTION_ID": self.id, "CODEBUILD_BUILD_NUMBER": str(next(builds))},
                                  capture_output=True, text=True)
            self.results[name] = done
            return done

        def synth(self):
            """A fresh checkout of the committed files, as CodeBuild's."""
            self.dir.mkdir()
            (self.dir / "environment.toml").write_bytes((work / "committed.toml").read_bytes())
            done = subprocess.run(["bash", str(REPO / "scripts/pipeline/synth.sh")], cwd=self.dir,
                                  env={**w.environ, "IMAGE_DIGEST": self.requested}, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[-2000:]
            self.results["synth"] = done
            self.digest = done.stdout.strip().splitlines()[-1]
            return done

        def smoke(self):
            done = self.step("smoke", "--digest", self.digest)
            if done.returncode == 0:
                self.record = done.stdout.strip().splitlines()[-1]
            return done

        def gate(self):
            return self.step("gate", "--digest", self.digest, "--record", self.record)

        def apply(self):
            return self.step("apply", "--digest", self.digest)

        def promote(self):
            return self.step("promote", "--digest", self.digest, "--record", self.record)

        def run(self):
            """Synth -> Smoke (with the gate) -> Apply -> Promote, stopping at the first failure."""
            self.synth()
            for stage in (self.smoke, self.gate, self.apply, self.promote):
                if stage().returncode:
                    return self
            return self

    def start_cluster_job(name: str, polls: int | None) -> None:
        """A user's RayJob running on the long-lived cluster (clusterSelector), ending after
        ``polls`` lists of RayJobs (None: it runs on)."""
        state = json.loads((kube / "state.json").read_text())
        state["rayjobs"][name] = {
            "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name},
            "spec": {"clusterSelector": {"ray.io/cluster": env.cluster.name}, "entrypoint": "python -m training"},
            "status": {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running", "rayClusterName": env.cluster.name},
            "polls_left": polls}
        (kube / "state.json").write_text(json.dumps(state))

    def submit_gpu_job(manifest: Path, polls: int) -> str:
        """A user's GPU RayJob (a synthesized manifest, its own cluster), applied as `submit`
        applies it and polled until it runs (Kueue admits it while the queue is empty); it runs
        ``polls`` ticks more. Its name."""
        job = {**yaml.safe_load(manifest.read_text()), "polls_left": polls}
        name = job["metadata"]["name"]
        kubectl = [str(kube / "kubectl"), "-n", env.ray.namespace]
        subprocess.run([*kubectl, "apply", "--server-side", "-f", "-"], input=json.dumps(job), env=w.environ,
                       capture_output=True, text=True, check=True)
        for _ in range(10):  # admitted, New, Initializing (its cluster's pods run), Running
            got = subprocess.run([*kubectl, "get", "rayjob", name], env=w.environ, capture_output=True, text=True,
                                 check=True)
            if json.loads(got.stdout)["status"].get("jobDeploymentStatus") == "Running":
                return name
        raise AssertionError(f"{name} never ran: {got.stdout}")

    def cluster_job(name: str) -> dict:
        return json.loads((kube / "state.json").read_text())["rayjobs"][name]["status"]

    w.start_cluster_job, w.cluster_job, w.submit_gpu_job = start_cluster_job, cluster_job, submit_gpu_job
    w.scenario, w.applied, w.live_images, w.Execution = scenario, applied, live_images, Execution
    w.read_json = lambda uri: read_record(s3, uri)
    w.keys = lambda prefix: [o["Key"] for o in s3.list_objects_v2(Bucket=env.bucket_name, Prefix=prefix).get("Contents", [])]
    return w


