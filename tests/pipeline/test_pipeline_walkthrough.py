"""The redeploy pipeline, walked through stage by stage with every stage's own code, against
local services: the real registry (Debian's docker-registry), moto's server (S3, SSM, DynamoDB,
CodePipeline) and a fake kubectl (fake_kubectl.py) that records what was applied and reports
the image IDs of the pods, as KubeRay + containerd would.

Stages run as the buildspecs run them: ``scripts/pipeline/synth.sh`` (Synth: digest choice,
``lock``, cdk8s synth), ``python -m raytrain_eks.pipeline smoke|gate|apply`` and the promoter
Lambda's ``promote``. Not run: ``cdk deploy`` (needs an account). The smoke run's record is
the output of ONE real local training run (``python -m training --config jobs/local.toml``),
which the fake kubectl "runs" by copying it into the bucket under the smoke run's name.

The story of one image tag: the committed digest is promoted; the watcher's new digest is
promoted; a push keeps it; a failing smoke run is rolled back; a regression is blocked.
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
from infra.lambdas.image_watcher.promote import promote
from infra.lambdas.image_watcher.watcher import ALREADY_TRIED, START, UP_TO_DATE, CodePipelineStarter, WatcherConfig, check

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NAME = "deep-learning-containers/ray"


class Results:
    def __init__(self):
        self.calls = []

    def success(self, job_id):
        self.calls.append(("success", job_id))

    def failure(self, job_id, message):
        self.calls.append(("failure", job_id, message))


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """ONE real run of the local job (tiny Qwen2, 2 CPU workers under Ray Train), few steps."""
    out = tmp_path_factory.mktemp("real-run")
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}
    done = subprocess.run(
        [sys.executable, "-m", "training", "--config", "jobs/local.toml",
         "--set", f"checkpoint.storage_path={out}", "--set", "checkpoint.run_name=smoke-local",
         "--set", "train.max_steps=6", "--set", "train.report_every_n_steps=3",
         "--set", "checkpoint.every_n_steps=0", "--set", "checkpoint.export_hf=false",
         "--set", "eval.every_n_steps=0", "--set", "eval.max_batches=2",
         # 6 steps cannot meet the local job's model criteria (its 40 steps do): the smoke gate
         # judges the image, so this run keeps only the transport criterion.
         "--set", "accept.eval_loss_after_max=0", "--set", "accept.improvement_min=0"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    run_dir = out / "smoke-local"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # only the record and the metrics: checkpoints are not part of what the pipeline reads
    keep = run_dir.parent / "record"
    keep.mkdir()
    for name in ("run.json", "metrics.jsonl"):
        (keep / name).write_bytes((run_dir / name).read_bytes())
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
    (work / "environment.toml").write_text(text)
    (work / "committed.toml").write_text(text)  # what the repository holds (git)
    env = load_environment(work / "environment.toml")
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
    w.environ = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{kube}:{os.environ['PATH']}",
                 "FAKE_KUBE_DIR": str(kube), "AWS_ENDPOINT_URL": aws["endpoint_url"],
                 "AWS_DEFAULT_REGION": aws["region_name"], "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "HISTORY_TABLE": table,
                 "PROMOTED_DIGEST_PARAMETER": parameter, "POLL_SECONDS": "0.05", "TIMEOUT_SECONDS": "3",
                 "PYTHON": sys.executable}
    w.promote = lambda event, results: promote(event, ssm=ssm, s3=s3, parameter_name=parameter,
                                               history=w.history, results=results, required_transport="any")

    def scenario(**values):
        (kube / "scenario.json").write_text(json.dumps({"run_source": str(real_run), **values}))

    def applied(kind="RayCluster"):
        path = kube / "applied.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
        return [r for r in rows if r["kind"] == kind]

    def step(*args, execution):
        return subprocess.run([sys.executable, "-m", "raytrain_eks.pipeline", *args], cwd=work,
                              env={**w.environ, "EXECUTION_ID": execution}, capture_output=True, text=True)

    def run_pipeline(requested: str, execution: str) -> dict:
        """Synth -> Smoke -> Gate -> Apply -> Promote, stopping at the first failed stage. Each
        run starts from the committed files (a fresh checkout, as CodeBuild's)."""
        (work / "environment.toml").write_bytes((work / "committed.toml").read_bytes())
        out = {"execution": execution}
        synth = subprocess.run(["bash", str(REPO / "scripts/pipeline/synth.sh")], cwd=work,
                               env={**w.environ, "IMAGE_DIGEST": requested}, capture_output=True, text=True)
        assert synth.returncode == 0, synth.stderr[-2000:]
        out["synth_log"] = synth.stderr
        digest = out["digest"] = synth.stdout.strip().splitlines()[-1]
        smoke = step("smoke", "--digest", digest, execution=execution)
        out["smoke"] = smoke
        if smoke.returncode:
            return out
        record = out["record"] = smoke.stdout.strip().splitlines()[-1]
        gate = out["gate"] = step("gate", "--digest", digest, "--record", record, execution=execution)
        if gate.returncode:
            return out
        apply = out["apply"] = step("apply", "--digest", digest, execution=execution)
        if apply.returncode:
            return out
        results = Results()
        params = json.dumps({"digest": digest, "smoke_record": record, "execution_id": execution})
        w.promote({"CodePipeline.job": {"id": execution, "data": {"actionConfiguration": {
            "configuration": {"UserParameters": params}}}}}, results)
        out["promote"] = results.calls
        return out

    w.scenario, w.applied, w.run_pipeline = scenario, applied, run_pipeline
    w.read_json = lambda uri: json.loads(s3.get_object(Bucket=uri.split("/")[2], Key=uri.split("/", 3)[3])["Body"].read())
    w.keys = lambda prefix: [o["Key"] for o in s3.list_objects_v2(Bucket=env.bucket_name, Prefix=prefix).get("Contents", [])]
    return w


def test_pipeline_walkthrough(walk):
    from raytrain_eks.commands.lock import lock

    # --- 0. the committed digest (raytrain-eks lock against the registry) is proven and promoted
    first = walk.push_image(b"image A\n")
    committed = walk.work / "committed.toml"
    lock(str(committed), registry_url="")
    assert load_environment(committed).image.digest == first
    walk.scenario(smoke_result="SUCCEEDED")
    run0 = walk.run_pipeline("spec", "exec-0")
    assert run0["digest"] == first
    assert run0["promote"] == [("success", "exec-0")], run0
    assert walk.promoted() == first
    record0 = walk.read_json(run0["record"])
    # the image that RAN comes from the pods' reported image IDs, beside the one asked for
    assert record0["status"] == "succeeded" and record0[RECORD_IMAGE_RAN]["pods"]
    assert all(i.endswith("@" + first) for i in record0[RECORD_IMAGE_RAN]["pods"].values())
    assert record0["throughput"]["tokens_per_s"] > 0 and record0["eval"]["after"][EVAL_LOSS] > 0
    # the smoke job ran on a cluster of its own; the long-lived one was applied with Recreate
    assert walk.applied("RayJob")[-1]["image"].endswith("@" + first)
    assert walk.applied()[-1]["image"].endswith("@" + first)
    assert walk.applied()[-1]["upgradeStrategy"] == {"type": "Recreate"}

    # --- 1. the tag moves; the watcher starts the pipeline with the new digest; it is promoted
    second = walk.push_image(b"image B\n")
    watched = walk.watch()
    assert watched["action"] == START and watched["current"] == second
    run1 = walk.run_pipeline(second, "exec-1")
    assert run1["promote"] == [("success", "exec-1")], run1["gate"].stderr
    assert walk.promoted() == second and walk.applied()[-1]["image"].endswith("@" + second)
    # the regression gate compared against the promoted run and left its report next to the run
    assert "gate: tokens_per_s: ok" in run1["gate"].stderr
    report_prefix = f"{walk.env.storage.prefix}/smoke-exec-1/regression/"
    assert f"{report_prefix}report.md" in walk.keys(report_prefix)

    # --- 2. a push after the automatic promotion: environment.toml still pins the first digest
    run2 = walk.run_pipeline("spec", "exec-2")
    assert run2["digest"] == second, run2["synth_log"]
    assert "silent rollback" in run2["synth_log"]
    assert walk.promoted() == second and walk.applied()[-1]["image"].endswith("@" + second)
    assert not [e for e in walk.history.events() if e["event"] == ROLLED_BACK]
    assert walk.watch()["action"] == UP_TO_DATE

    # --- 3. a new digest whose smoke run fails: rolled back, recorded with the reason
    third = walk.push_image(b"image C\n")
    assert walk.watch()["action"] == START
    walk.scenario(smoke_result="FAILED")
    run3 = walk.run_pipeline(third, "exec-3")
    assert run3["smoke"].returncode == 1 and "promote" not in run3
    rollback = next(e for e in walk.history.events() if e["event"] == ROLLED_BACK)
    assert rollback["digest"] == third and rollback["rolled_back_to"] == second
    assert "smoke" in rollback["reason"] and "FAILED" in rollback["reason"]
    assert walk.promoted() == second and walk.applied()[-1]["image"].endswith("@" + second)
    assert walk.watch()["action"] == ALREADY_TRIED  # not retried every few hours

    # --- 4. a new digest that runs, but slower than the configured fraction: blocked
    fourth = walk.push_image(b"image D\n")
    assert walk.watch()["action"] == START
    # configured (and committed): the new image must be 50% faster than the promoted one
    committed.write_text(committed.read_text().replace("min_tokens_per_s_fraction = 0.9",
                                                     "min_tokens_per_s_fraction = 1.5"))
    walk.scenario(smoke_result="SUCCEEDED")
    run4 = walk.run_pipeline(fourth, "exec-4")
    assert run4["smoke"].returncode == 0 and run4["gate"].returncode == 1 and "apply" not in run4
    assert "tokens_per_s" in run4["gate"].stderr and "REGRESSION" in run4["gate"].stderr
    newest = next(e for e in walk.history.events() if e["event"] == ROLLED_BACK)
    assert newest["digest"] == fourth and "regression" in newest["reason"]
    report_prefix = f"{walk.env.storage.prefix}/smoke-exec-4/regression/"
    report = walk.s3.get_object(Bucket=walk.env.bucket_name, Key=f"{report_prefix}report.md")["Body"].read().decode()
    # side by side: the image each run's pods reported differs between the two columns
    assert second in report and fourth in report
    assert walk.promoted() == second and walk.applied()[-1]["image"].endswith("@" + second)
    # the push re-proved and re-promoted the promoted digest; nothing else was ever promoted
    assert [e["digest"] for e in walk.history.promotions()] == [second, second, first]
