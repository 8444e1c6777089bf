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

from pathlib import Path

import pytest
from walk_env import make_walk

from environment import load_environment
from environment.contract import RECORD_IMAGE_RAN
from training.contract import EVAL_LOSS
from infra.lambdas.image_watcher.history import ROLLED_BACK
from infra.lambdas.image_watcher.watcher import ALREADY_TRIED, START, UP_TO_DATE

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("local_run")]



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
    return make_walk(tmp_path, aws, registry, real_run)


def rollbacks(walk) -> list[dict]:
    return [e for e in walk.history.events() if e["event"] == ROLLED_BACK]


def test_pipeline_walkthrough(walk):
    from raytrain_eks.verify.lock import lock

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
    report_prefix = run1.record.split("/", 3)[3].rsplit("/", 1)[0] + "/regression/"
    assert report_prefix.startswith(f"{walk.env.storage.prefix}/smoke-exec-1-")
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
    report_prefix = run4.record.split("/", 3)[3].rsplit("/", 1)[0] + "/regression/"
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
    # the very version the gate judged is gone (Promote reads that one, not the newest)
    bucket, key = run6.record.removeprefix("s3://").split("/", 1)
    key, _, version = key.partition("?versionId=")
    walk.s3.delete_object(Bucket=bucket, Key=key, VersionId=version)
    assert run6.promote().returncode == 1
    failed = rollbacks(walk)[0]
    assert failed["digest"] == sixth and failed["reason"].startswith("promote: smoke record") \
        and "does not exist" in failed["reason"]
    assert failed["outcome"] == f"long-lived cluster re-applied: the manifest execution exec-5w applied (@{fifth})"
    assert walk.promoted() == fifth and walk.live_images() == {fifth}
    assert [r["image"].rsplit("@", 1)[1] for r in walk.applied()[applies:]] == [sixth, fifth]

    # the whole history: promotions of A, B, B (re-proof) and E; nothing else was ever promoted
    assert [e["digest"] for e in walk.history.promotions()] == [fifth, second, second, first]
