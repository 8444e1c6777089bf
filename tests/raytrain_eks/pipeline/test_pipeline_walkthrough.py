"""The redeploy pipeline, walked through stage by stage with every stage's own code, against
local services: the real registry (Debian's docker-registry), moto's server (S3, SSM, DynamoDB,
CodePipeline) and a fake kubectl (fake_kubectl.py) whose RayCluster Recreate and RayJob status
follow KubeRay v1.7.0 (the spec-hash rule; Initializing, PENDING, RUNNING, then a terminal
state), citing its upstream files.

Stages run as the buildspecs run them: ``scripts/pipeline/synth.sh`` (Synth: digest choice,
``lock``, cdk8s synth), ``python -m raytrain_eks.pipeline smoke|gate|apply|promote``. Each
execution has a workspace of its own (its artifacts), starting from the committed spec (which
is locked), so two executions can be interleaved stage by stage as CodePipeline's QUEUED mode
does. Not run: ``cdk deploy`` (needs an account); Synth's tests and ``cdk synth``
(scripts/pipeline/local_synth.py runs the whole command list). The smoke run's record is the
output of the session's ONE real local training run (``local_run`` in tests/conftest.py:
``raytrain-eks submit jobs/local.toml --local``), which the fake kubectl "runs" by copying it into
the bucket under the smoke run's name.

The story of one image tag: the committed digest is promoted; the watcher's new digest is
promoted; a push keeps it; a failing smoke run and a regression leave the long-lived cluster
untouched; a push whose Synth ran while the watcher's execution was in Smoke cannot undo the
newer promotion; a Promote that fails after Apply puts the cluster back and says so.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest

from environment import load_environment
from environment.contract import RECORD_IMAGE_RAN
from training.contract import EVAL_LOSS
from infra.lambdas.image_watcher.history import PROMOTED, ROLLED_BACK, PromotionHistory
from infra.lambdas.image_watcher.watcher import ALREADY_TRIED, START, UP_TO_DATE, CodePipelineStarter, WatcherConfig, check

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("local_run")]

REPO = Path(__file__).resolve().parents[3]
NAME = "deep-learning-containers/ray"


@pytest.fixture(scope="module")
def real_run(local_run, tmp_path_factory) -> Path:
    """The record and metrics of the session's ONE real local run (tests/conftest.py
    ``local_run``: the local job under Ray Train on 2 CPU workers, submitted as a user does)."""
    out, done = local_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # only the record and the metrics: checkpoints are not part of what the pipeline reads
    keep = tmp_path_factory.mktemp("record")
    for name in ("run.json", "metrics.jsonl"):
        (keep / name).write_bytes((out / name).read_bytes())
    return keep


@pytest.fixture
def walk(tmp_path, aws, registry, real_run):
    """A workspace (environment.toml on the local registry), the AWS side of the pipeline stack
    in moto, the fake kubectl on PATH."""
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

    ssm, ddb, cp, iam, s3 = (boto3.client(s, **aws) for s in ("ssm", "dynamodb", "codepipeline", "iam", "s3"))
    s3.create_bucket(Bucket=env.bucket_name)
    parameter, table, pipeline = f"/raytrain/walk-{suffix}/promoted", f"promotions-{suffix}", f"redeploy-{suffix}"
    ssm.put_parameter(Name=parameter, Value="none", Type="String")  # as the stack creates it
    ddb.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                     KeySchema=[{"AttributeName": "image", "KeyType": "HASH"},
                                {"AttributeName": "at", "KeyType": "RANGE"}],
                     AttributeDefinitions=[{"AttributeName": "image", "AttributeType": "S"},
                                           {"AttributeName": "at", "AttributeType": "S"}])
    role = iam.create_role(RoleName=f"walk-{suffix}", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "codepipeline.amazonaws.com"}}]}))
    action = {"name": "a", "actionTypeId": {"category": "Source", "owner": "AWS", "provider": "S3", "version": "1"},
              "configuration": {"S3Bucket": "b", "S3ObjectKey": "k"}, "outputArtifacts": [{"name": "o"}]}
    cp.create_pipeline(pipeline={
        "name": pipeline, "roleArn": role["Role"]["Arn"], "pipelineType": "V2",
        "artifactStore": {"type": "S3", "location": "artifacts"},
        "variables": [{"name": "IMAGE_DIGEST", "defaultValue": "spec"}],
        "stages": [{"name": "Source", "actions": [action]},
                   {"name": "Deploy", "actions": [dict(action, name="b", outputArtifacts=[{"name": "p"}])]}]})

    kube = tmp_path / "kube"
    kube.mkdir()
    (kube / "kubectl").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).parent / "fake_kubectl.py"}" "$@"\n')
    (kube / "kubectl").chmod(0o755)

    class Walk:
        pass

    w = Walk()
    w.env, w.work, w.kube, w.s3, w.ssm = env, work, kube, s3, ssm
    config = WatcherConfig(repository=env.image.repository, tag=tag, parameter_name=parameter,
                           table_name=table, pipeline_name=pipeline)
    w.history = PromotionHistory(client=ddb, table_name=table, image=config.image)
    w.watch = lambda: check(config, ssm=ssm, history=w.history, starter=CodePipelineStarter(cp, pipeline))
    w.push_image = lambda content: registry.push_image(NAME, tag, content=content)
    w.promoted = lambda: ssm.get_parameter(Name=parameter)["Parameter"]["Value"]
    # Generous bounds: every wait ends on its event (a terminal RayJob, a ready cluster);
    # only a cluster that never gets ready waits this long.
    w.environ = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{kube}:{os.environ['PATH']}",
                 "FAKE_KUBE_DIR": str(kube), "AWS_ENDPOINT_URL": aws["endpoint_url"],
                 "AWS_DEFAULT_REGION": aws["region_name"], "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "HISTORY_TABLE": table,
                 "PROMOTED_DIGEST_PARAMETER": parameter, "POLL_SECONDS": "0.05", "TIMEOUT_SECONDS": "300",
                 "PYTHON": sys.executable}

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
                                  env={**w.environ, "EXECUTION_ID": self.id}, capture_output=True, text=True)
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

    w.scenario, w.applied, w.live_images, w.Execution = scenario, applied, live_images, Execution
    w.read_json = lambda uri: json.loads(s3.get_object(Bucket=uri.split("/")[2], Key=uri.split("/", 3)[3])["Body"].read())
    w.keys = lambda prefix: [o["Key"] for o in s3.list_objects_v2(Bucket=env.bucket_name, Prefix=prefix).get("Contents", [])]
    return w


def rollbacks(walk) -> list[dict]:
    return [e for e in walk.history.events() if e["event"] == ROLLED_BACK]


def test_pipeline_walkthrough(walk):
    from raytrain_eks.commands.lock import lock

    # --- 0. the committed digest (raytrain-eks lock against the registry, committed: the spec
    # every Synth starts from is locked) is proven and promoted
    first = walk.push_image(b"image A\n")
    committed = walk.work / "committed.toml"
    lock(str(committed), registry_url="")
    assert load_environment(committed).image.digest == first
    walk.scenario(smoke_result="SUCCEEDED")
    run0 = walk.Execution("exec-0", "spec").run()
    assert run0.digest == first
    assert run0.results["promote"].returncode == 0, run0.results["promote"].stderr
    assert walk.promoted() == first and walk.history.promoted() == first
    record0 = walk.read_json(run0.record)
    # the image that RAN comes from the pods' reported image IDs, beside the one asked for
    assert record0["status"] == "succeeded" and record0[RECORD_IMAGE_RAN]["pods"]
    assert all(i.endswith("@" + first) for i in record0[RECORD_IMAGE_RAN]["pods"].values())
    assert record0["throughput"]["tokens_per_s"] > 0 and record0["eval"]["after"][EVAL_LOSS] > 0
    # the smoke job went Initializing -> PENDING -> RUNNING -> SUCCEEDED on a cluster of its own
    smoke_log = run0.results["smoke"].stderr
    assert smoke_log.index("PENDING / Initializing") < smoke_log.index("PENDING / Running") \
        < smoke_log.index("RUNNING / Running") < smoke_log.index("SUCCEEDED / Complete")
    assert walk.applied("RayJob")[-1]["image"].endswith("@" + first)
    assert walk.applied()[-1]["image"].endswith("@" + first)
    assert walk.applied()[-1]["upgradeStrategy"] == {"type": "Recreate"}
    assert walk.live_images() == {first}
    # nothing to compare against yet, and the gate says so
    assert "regression: not comparable, no baseline (no promoted run of another digest yet)" in \
        run0.results["gate"].stderr

    # --- 1. the tag moves; the watcher starts the pipeline with the new digest; it is promoted
    second = walk.push_image(b"image B\n")
    watched = walk.watch()
    assert watched["action"] == START and watched["current"] == second
    run1 = walk.Execution("exec-1", second).run()
    assert run1.results["promote"].returncode == 0, run1.results["gate"].stderr
    assert walk.promoted() == second and walk.applied()[-1]["image"].endswith("@" + second)
    assert walk.applied()[-1]["recreated"] and walk.live_images() == {second}
    # the regression gate compared against the promoted run and left its report next to the run
    assert "gate: tokens_per_s: ok" in run1.results["gate"].stderr
    report_prefix = f"{walk.env.storage.prefix}/smoke-exec-1/regression/"
    assert f"{report_prefix}report.md" in walk.keys(report_prefix)

    # --- 2. a push after the automatic promotion: environment.toml still pins the first digest
    run2 = walk.Execution("exec-2", "spec").run()
    assert run2.digest == second, run2.results["synth"].stderr
    assert "silent rollback" in run2.results["synth"].stderr
    assert walk.promoted() == second and walk.applied()[-1]["image"].endswith("@" + second)
    # the same manifest again: KubeRay's spec hash is unchanged, no pod is recreated
    assert not walk.applied()[-1]["recreated"]
    assert not rollbacks(walk)
    assert walk.watch()["action"] == UP_TO_DATE
    applies = len(walk.applied())

    # --- 3. a new digest whose smoke run fails: recorded with the reason; the long-lived
    # cluster was never touched, so no apply is issued
    third = walk.push_image(b"image C\n")
    assert walk.watch()["action"] == START
    walk.scenario(smoke_result="FAILED")
    run3 = walk.Execution("exec-3", third).run()
    assert run3.results["smoke"].returncode == 1 and "promote" not in run3.results
    [rollback] = rollbacks(walk)
    assert rollback["digest"] == third and rollback["rolled_back_to"] == second
    assert "smoke" in rollback["reason"] and "FAILED" in rollback["reason"]
    assert rollback["outcome"] == f"long-lived cluster untouched: still on the manifest execution exec-2 applied (@{second})"
    assert len(walk.applied()) == applies and walk.live_images() == {second}
    assert walk.promoted() == second
    assert walk.watch()["action"] == ALREADY_TRIED  # not retried every few hours

    # --- 4. a new digest that runs, but slower than the configured fraction: blocked, untouched
    fourth = walk.push_image(b"image D\n")
    assert walk.watch()["action"] == START
    # configured (and committed): the new image must be 50% faster than the promoted one
    original = committed.read_text()
    committed.write_text(original.replace("min_tokens_per_s_fraction = 0.9", "min_tokens_per_s_fraction = 1.5"))
    walk.scenario(smoke_result="SUCCEEDED")
    run4 = walk.Execution("exec-4", fourth).run()
    assert run4.results["smoke"].returncode == 0 and run4.results["gate"].returncode == 1
    assert "apply" not in run4.results
    assert "tokens_per_s" in run4.results["gate"].stderr and "REGRESSION" in run4.results["gate"].stderr
    newest = rollbacks(walk)[0]
    assert newest["digest"] == fourth and "regression" in newest["reason"]
    assert newest["outcome"].startswith("long-lived cluster untouched")
    report_prefix = f"{walk.env.storage.prefix}/smoke-exec-4/regression/"
    report = walk.s3.get_object(Bucket=walk.env.bucket_name, Key=f"{report_prefix}report.md")["Body"].read().decode()
    # side by side: the image each run's pods reported differs between the two columns
    assert second in report and fourth in report
    assert walk.promoted() == second and len(walk.applied()) == applies
    committed.write_text(original)

    # --- 5. interleaved: the watcher's execution for E is in Smoke when a push's Synth runs
    # (QUEUED mode: one execution per stage); the push picks the promoted B; E is promoted;
    # the push then reaches Apply: the promoted digest is no longer what its Synth saw
    fifth = walk.push_image(b"image E\n")
    assert walk.watch()["action"] == START
    watcher, push = walk.Execution("exec-5w", fifth), walk.Execution("exec-5p", "spec")
    watcher.synth()
    assert watcher.smoke().returncode == 0
    push.synth()
    assert push.digest == second
    assert watcher.gate().returncode == 0 and watcher.apply().returncode == 0
    assert watcher.promote().returncode == 0, watcher.results["promote"].stderr
    assert push.smoke().returncode == 0 and push.gate().returncode == 0
    assert push.apply().returncode == 1 and "superseded" in push.results["apply"].stderr
    # the newer promotion survives: promoted, on the cluster, and nothing re-applied B
    assert walk.promoted() == fifth and walk.history.promoted() == fifth
    assert walk.applied()[-1]["image"].endswith("@" + fifth) and walk.live_images() == {fifth}
    superseded = rollbacks(walk)[0]
    assert superseded["digest"] == second and superseded["outcome"].startswith("long-lived cluster untouched")
    applies = len(walk.applied())

    # --- 6. Promote fails after Apply (the smoke record is gone by then): the history says so
    # and the cluster is back on what the last promotion applied
    sixth = walk.push_image(b"image F\n")
    assert walk.watch()["action"] == START
    run6 = walk.Execution("exec-6", sixth)
    run6.synth()
    assert run6.smoke().returncode == 0 and run6.gate().returncode == 0 and run6.apply().returncode == 0
    assert walk.live_images() == {sixth}
    bucket, key = run6.record.removeprefix("s3://").split("/", 1)
    walk.s3.delete_object(Bucket=bucket, Key=key)
    assert run6.promote().returncode == 1
    failed = rollbacks(walk)[0]
    assert failed["digest"] == sixth and failed["reason"].startswith("promote: smoke record") \
        and "does not exist" in failed["reason"]
    assert failed["outcome"] == f"long-lived cluster re-applied: the manifest execution exec-5w applied (@{fifth})"
    assert walk.promoted() == fifth and walk.live_images() == {fifth}
    assert [r["image"].rsplit("@", 1)[1] for r in walk.applied()[applies:]] == [sixth, fifth]

    # the whole history: promotions of A, B, B (re-proof) and E; nothing else was ever promoted
    assert [e["digest"] for e in walk.history.promotions()] == [fifth, second, second, first]
