"""The image watcher and the promotion step: moto's server (SSM, DynamoDB, CodePipeline) on
127.0.0.1 for AWS, the real local registry for the digest.
"""
from __future__ import annotations

import dataclasses
import json
import uuid
from types import SimpleNamespace

import boto3
import pytest

from environment.contract import RECORD_IMAGE_RAN
from infra.lambdas.image_watcher import watcher as watcher_module
from infra.lambdas.image_watcher.history import PromotionHistory, Superseded
from infra.lambdas.image_watcher.promote import PromotionError, promote
from infra.lambdas.image_watcher.watcher import (
    ALREADY_TRIED, START, UP_TO_DATE, CodePipelineStarter, WatcherConfig, check, decide,
)
from infra.lambdas.image_watcher.registry import RegistryError
from training.transport import aggregate, classify_lines

from fixtures_pipeline import create_watcher_resources
from oci_registry import free_port

NAME = "deep-learning-containers/ray"
BUCKET = "raytrain-smoke-records"
SMOKE = f"s3://{BUCKET}/runs/smoke-1/run.json"
# Real NCCL INFO lines (aws-ofi-nccl 1.20 on EFA; NCCL socket fall-back): what an EFA run and a silent TCP fall-back print.
EFA_LINES = ["NET/OFI Selected provider is efa, fabric is efa (found 1 nics)",
             "Channel 00/0 : 0[0] -> 4[0] [send] via NET/Libfabric/0"]
SOCKET_LINES = ["Using network Socket", "Channel 00/0 : 0[0] -> 4[0] [send] via NET/Socket/0"]


@pytest.fixture
def world(aws, registry):
    """A fresh parameter, table, pipeline and tag per test (names are unique, the servers shared)."""
    suffix = uuid.uuid4().hex[:8]
    ssm, ddb, cp, iam, s3 = (boto3.client(s, **aws) for s in ("ssm", "dynamodb", "codepipeline", "iam", "s3"))
    if BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
    config = WatcherConfig(repository=f"{registry.host}/{NAME}", tag=f"watch-{suffix}",
                           parameter_name=f"/raytrain/test-{suffix}/promoted-digest",
                           table_name=f"history-{suffix}", pipeline_name=f"redeploy-{suffix}")
    create_watcher_resources(aws, config)
    history = PromotionHistory(client=ddb, table_name=config.table_name, image=config.image)

    class World:
        pass

    w = World()
    w.config, w.ssm, w.cp, w.history, w.s3 = config, ssm, cp, history, s3
    w.starter = CodePipelineStarter(cp, config.pipeline_name)
    w.watch = lambda **kw: check(config, ssm=ssm, history=history, starter=w.starter, **kw)
    w.push = lambda content: registry.push_image(NAME, config.tag, content=content)
    w.executions = lambda: cp.list_pipeline_executions(pipelineName=config.pipeline_name)["pipelineExecutionSummaries"]
    w.smoke = lambda digest, lines=EFA_LINES, status="succeeded", key=f"runs/smoke-{suffix}/run.json", ran=None: \
        smoke_record(s3, key, config.repository, digest, lines, status, ran)
    w.promote = lambda digest, record=SMOKE, expected="", execution="exec-1": promote(
        ssm=ssm, s3=s3, parameter_name=config.parameter_name, history=history, digest=digest,
        smoke_record=record, execution_id=execution, expected=expected, required_transport="efa")
    w.promoted = lambda: ssm.get_parameter(Name=config.parameter_name)["Parameter"]["Value"]
    return w


def smoke_record(s3, key: str, repository: str, digest: str, lines: list[str], status: str,
                 ran: str | None = None) -> str:
    """Upload a run.json as the smoke job writes it (transport evidence from real NCCL lines
    through training/transport.py, the producer's own code) with the pods' image IDs the smoke
    step adds (``ran``: the digest they report, default the one asked for); returns its URI.
    The whole pipeline with a REAL run's record: test_pipeline_walkthrough.py."""
    ranks = []
    for rank in range(8):
        classified = classify_lines(lines)
        classified.rank, classified.host = rank, f"ip-10-0-0-{rank // 4}"
        ranks.append(classified)
    record = {"status": status, "image": f"{repository}@{digest}", "transport": aggregate(ranks),
              "error": None if status == "succeeded" else "RuntimeError: boom",
              RECORD_IMAGE_RAN: {"pods": {f"smoke-k7x2q-head/ray-head": f"{repository}@{ran or digest}",
                                          f"smoke-k7x2q-gpu-worker-0/ray-worker": f"{repository}@{digest}"}}}
    s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(record).encode())
    return f"s3://{BUCKET}/{key}"


def test_decide_is_the_whole_policy():
    d1, d2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    assert decide(current=d1, promoted=d1, already_triggered=False) == UP_TO_DATE
    assert decide(current=d2, promoted=d1, already_triggered=False) == START
    assert decide(current=d2, promoted="", already_triggered=False) == START
    assert decide(current=d2, promoted=d1, already_triggered=True) == ALREADY_TRIED


def test_new_digest_starts_the_pipeline_once_with_the_digest_as_variable(world):
    # given a tag nobody has promoted yet
    digest = world.push(b"first\n")
    # when the watcher runs twice
    first = world.watch()
    second = world.watch()
    # then exactly one execution, carrying the digest, recorded as triggered
    assert first["action"] == START and first["current"] == digest and first["promoted"] == "(none)"
    assert second["action"] == ALREADY_TRIED
    executions = world.executions()
    assert len(executions) == 1
    execution = world.cp.get_pipeline_execution(pipelineName=world.config.pipeline_name,
                                                pipelineExecutionId=first["execution_id"])
    assert execution["pipelineExecution"]["variables"] == [{"name": "IMAGE_DIGEST", "resolvedValue": digest}]
    [event] = list(world.history.events())
    assert (event["event"], event["digest"], event["execution_id"]) == ("triggered", digest, first["execution_id"])


class EndedRuns:
    """The real starter (moto), with the status of each execution it started set by the test:
    moto's executions report Succeeded at once (it runs no actions)."""

    def __init__(self, starter, status="InProgress"):
        self.starter, self.statuses, self.default = starter, {}, status

    def start(self, digest, attempt=1):
        execution = self.starter.start(digest, attempt)
        self.statuses[execution] = self.default
        return execution

    def status(self, execution_id):
        return self.statuses[execution_id]


def test_a_failed_execution_that_recorded_nothing_is_recorded_on_the_next_tick_and_retried(world):
    """A Smoke build killed by its CodeBuild timeout (or a Synth that refused the run) records
    nothing itself: the next tick records an ``ended`` item (infrastructure) and starts the
    digest again, up to pipeline.max_attempts executions."""
    starter = EndedRuns(world.starter)
    watch = lambda: check(world.config, ssm=world.ssm, history=world.history, starter=starter)  # noqa: E731
    digest = world.push(b"killed build\n")
    first = watch()
    assert first["action"] == START
    # while its execution runs, it is not started again, and nothing is recorded
    running = watch()
    assert running["action"] == ALREADY_TRIED and "InProgress" in running["why"]
    assert [e["event"] for e in world.history.events()] == ["triggered"]
    # the build is killed by its timeout: the execution failed, no step recorded why
    starter.statuses[first["execution_id"]] = "Failed"
    second = watch()
    assert second["action"] == START and second["attempt"] == "2" and second["execution_id"] != first["execution_id"]
    ended = next(e for e in world.history.events() if e["event"] == "ended")
    assert (ended["execution_id"], ended["failure"]) == (first["execution_id"], "infrastructure")
    assert "ended Failed with no failure recorded" in ended["reason"]
    # up to max_attempts starts in all, each failed execution recorded once
    for _ in range(world.config.max_attempts):
        starter.statuses = dict.fromkeys(starter.statuses, "Failed")
        last = watch()
    assert last["action"] == ALREADY_TRIED and "pipeline.max_attempts" in last["why"]
    events = [e["event"] for e in world.history.events()]
    assert events.count("triggered") == world.config.max_attempts == events.count("ended")
    assert {e["digest"] for e in world.history.events()} == {digest}


def test_an_image_failure_shelves_the_digest_and_an_infrastructure_failure_does_not(world):
    starter = EndedRuns(world.starter, status="Failed")
    watch = lambda: check(world.config, ssm=world.ssm, history=world.history, starter=starter)  # noqa: E731
    busy = world.push(b"busy gpus\n")
    first = watch()
    world.history.record(event="rolled-back", digest=busy, execution_id=first["execution_id"], rolled_back_to="none",
                         reason="smoke: PreRunningDeadlineExceeded", outcome="untouched", failure="infrastructure")
    assert watch()["action"] == START  # retried: not the image's fault
    broken = world.push(b"broken image\n")
    first = watch()
    world.history.record(event="rolled-back", digest=broken, execution_id=first["execution_id"], rolled_back_to="none",
                         reason="gate: regression", outcome="untouched", failure="image")
    shelved = watch()
    assert shelved["action"] == ALREADY_TRIED and shelved["why"].startswith("image failure")


def test_a_deferred_digest_is_started_again_only_inside_the_maintenance_window(world):
    import datetime

    config = dataclasses.replace(world.config, maintenance_window="sat 02:00-04:00")
    starter = EndedRuns(world.starter, status="Failed")
    digest = world.push(b"deferred\n")
    first = check(config, ssm=world.ssm, history=world.history, starter=starter)
    world.history.record(event="rolled-back", digest=digest, execution_id=first["execution_id"], rolled_back_to="none",
                         reason="apply: job running", outcome="untouched", failure="deferred")
    friday = datetime.datetime(2026, 12, 4, 12, 0, tzinfo=datetime.timezone.utc)  # a Friday
    waiting = check(config, ssm=world.ssm, history=world.history, starter=starter, now=friday)
    assert waiting["action"] == ALREADY_TRIED and "opens Sat 02:00 UTC" in waiting["why"]
    saturday = datetime.datetime(2026, 12, 5, 2, 30, tzinfo=datetime.timezone.utc)
    assert check(config, ssm=world.ssm, history=world.history, starter=starter, now=saturday)["action"] == START


def test_promotion_then_tag_moves_then_rollback(world):
    old = world.push(b"old\n")
    world.watch()
    # the pipeline proved it: promote
    record = world.smoke(old)
    item = world.promote(old, record)
    assert world.promoted() == old and item["smoke_record"] == record
    assert world.watch()["action"] == UP_TO_DATE
    # the tag moves to a new image: one new run for the new digest
    new = world.push(b"new\n")
    moved = world.watch()
    assert (moved["action"], moved["current"], moved["promoted"]) == (START, new, old)
    assert len(world.executions()) == 2
    # the new digest fails its smoke run; an operator rolls back by promoting the old one again
    world.promote(old, record, expected=old, execution="exec-2")
    # then the watcher does not re-propose the digest that was already tried
    assert world.watch()["action"] == ALREADY_TRIED
    assert len(world.executions()) == 2
    # and the operator can list the history: who was promoted when, with which smoke record
    promotions = world.history.promotions()
    assert [p["digest"] for p in promotions] == [old, old]
    assert all(p["smoke_record"] == record and p["at"].endswith("Z") for p in promotions)
    assert [e["event"] for e in world.history.events(newest_first=False)] == \
        ["triggered", "promoted", "triggered", "promoted"]


@pytest.mark.parametrize("params, expected", [
    ({"digest": "latest", "smoke_record": SMOKE}, "is not sha256"),
    ({"digest": "sha256:" + "a" * 64, "smoke_record": ""}, "is not an s3:// URI"),
])
def test_promote_refuses_bad_input_and_promotes_nothing(world, params, expected):
    with pytest.raises(PromotionError, match=expected):
        world.promote(params["digest"], params["smoke_record"])
    assert world.promoted() == "none" and list(world.history.events()) == []


def test_promotion_is_a_compare_and_swap_on_the_digest_synth_saw(world):
    """Two executions whose Synth both saw nothing promoted: the first promotes, the second is
    superseded, and neither SSM nor the history gets its digest."""
    first, second = world.push(b"first cas\n"), world.push(b"second cas\n")
    world.promote(first, world.smoke(first, key="runs/smoke-a/run.json"), expected="", execution="exec-a")
    with pytest.raises(Superseded, match="another execution promoted meanwhile"):
        world.promote(second, world.smoke(second, key="runs/smoke-b/run.json"), expected="", execution="exec-b")
    assert world.promoted() == first and world.history.promoted() == first
    assert [p["digest"] for p in world.history.promotions()] == [first]
    # the DynamoDB swap itself refuses a stale expectation even when SSM was not yet written
    with pytest.raises(Superseded):
        world.history.promote(expected="", digest=second, execution_id="exec-c", smoke_record=SMOKE)
    assert [p["digest"] for p in world.history.promotions()] == [first]


def test_the_first_swap_promotes_over_a_digest_only_ssm_holds(world):
    """A stack deployed before the ``~promoted`` item existed has the promoted digest in SSM only:
    Synth expects it, and the first compare-and-swap promotion must not be Superseded for ever."""
    d1, d2 = world.push(b"ssm only\n"), world.push(b"after ssm\n")
    world.ssm.put_parameter(Name=world.config.parameter_name, Value=d1, Type="String", Overwrite=True)
    assert world.history.promoted() == ""  # no pointer item
    world.promote(d2, world.smoke(d2), expected=d1)
    assert world.promoted() == d2 and world.history.promoted() == d2
    # from then on the item decides: an expectation of the old SSM digest is stale
    with pytest.raises(Superseded):
        world.promote(d1, world.smoke(d1, key="runs/smoke-old/run.json"), expected=d1, execution="exec-2")


def test_the_promoted_item_wins_over_a_failed_ssm_write_and_promote_repairs_it(world):
    from infra.lambdas.image_watcher.promote import promoted_digest

    d1, d2 = world.push(b"item first\n"), world.push(b"item second\n")
    world.promote(d1, world.smoke(d1))
    # given the SSM write after the transaction failed (SSM still holds the placeholder)
    world.ssm.put_parameter(Name=world.config.parameter_name, Value="none", Type="String", Overwrite=True)
    # then what Synth reads is the item's digest, and the next promotion expecting it goes through
    assert promoted_digest(world.ssm, world.config.parameter_name, world.history) == d1
    assert world.promoted() == "none"  # reading repairs nothing
    with pytest.raises(PromotionError):  # a run refused on its record still repairs SSM from the item
        world.promote(d2, f"s3://{BUCKET}/runs/never-written/run.json", expected=d1, execution="exec-2")
    assert world.promoted() == d1
    world.promote(d2, world.smoke(d2, key="runs/smoke-d2/run.json"), expected=d1, execution="exec-3")
    assert world.promoted() == d2 and world.history.promoted() == d2


OTHER_DIGEST = "sha256:" + "b" * 64


@pytest.mark.parametrize("case, expected", [
    ("socket", "transport is 'socket', required 'efa' (transport gate)"),
    ("failed", "status is 'failed', not 'succeeded': RuntimeError: boom"),
    ("other-image", "not @sha256:"),
    ("manifest-only", "not @sha256:"),
    ("missing", "does not exist"),
])
def test_promote_gates_on_the_smoke_record(world, case, expected):
    # given a digest the smoke run did NOT prove
    digest = world.push(b"gate\n")
    uri = {"socket": lambda: world.smoke(digest, lines=SOCKET_LINES),
           "failed": lambda: world.smoke(digest, status="failed"),
           "other-image": lambda: world.smoke(OTHER_DIGEST),
           # the manifest asked for this digest, but the head pod still runs another image
           "manifest-only": lambda: world.smoke(digest, ran=OTHER_DIGEST),
           "missing": lambda: f"s3://{BUCKET}/runs/never-written/run.json"}[case]()
    # when the pipeline's promote step runs, then it fails and promotes nothing
    with pytest.raises(PromotionError) as raised:
        world.promote(digest, uri)
    assert expected in str(raised.value)
    assert world.promoted() == "none" and world.history.promotions() == []


@pytest.mark.parametrize("code, status, expected, message", [
    ("NoSuchKey", 404, "RecordMissing", "does not exist"),
    ("NoSuchVersion", 404, "RecordMissing", "does not exist"),
    # With s3:ListBucket (the Smoke and Promote roles have it), S3 answers a missing key with 404
    # and a 403 only for a key it refuses to serve (AWS GetObject documentation, "Permissions"):
    # never read as missing, which would skip the regression gate.
    ("AccessDenied", 403, "RecordUnreadable", r"cannot be read \(AccessDenied\)"),
])
def test_read_record_tells_missing_from_unreadable(code, status, expected, message):
    """moto does not enforce IAM, so botocore's own error is raised."""
    from botocore.exceptions import ClientError

    from infra.lambdas.image_watcher import promote as promote_module

    class S3:
        exceptions = SimpleNamespace(ClientError=ClientError)

        def get_object(self, **kwargs):
            assert kwargs.get("VersionId") == "v1"  # the exact version the URI names
            raise ClientError({"Error": {"Code": code, "Message": "x"},
                               "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")

    with pytest.raises(getattr(promote_module, expected), match=message) as raised:
        promote_module.read_record(S3(), SMOKE + "?versionId=v1")
    assert raised.value.failure == "infrastructure"  # not the image's verdict


def test_unreachable_registry_fails_the_invocation_and_starts_nothing(world):
    config = dataclasses.replace(world.config, registry_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(RegistryError, match="registry unreachable"):
        check(config, ssm=world.ssm, history=world.history, starter=world.starter)
    assert world.executions() == [] and list(world.history.events()) == []


def test_lambda_handler_wiring_reads_its_environment(world, aws, monkeypatch):
    # watcher.watch (the Lambda handler) builds its own boto3 clients: point them at moto through the standard variables
    digest = world.push(b"handler\n")
    for key, value in {"AWS_ENDPOINT_URL": aws["endpoint_url"], "AWS_DEFAULT_REGION": aws["region_name"],
                       "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "IMAGE_REPOSITORY": world.config.repository, "IMAGE_TAG": world.config.tag,
                       "PROMOTED_DIGEST_PARAMETER": world.config.parameter_name,
                       "HISTORY_TABLE": world.config.table_name,
                       "PIPELINE_NAME": world.config.pipeline_name}.items():
        monkeypatch.setenv(key, value)
    result = watcher_module.watch({}, None)
    assert result["action"] == START and result["current"] == digest
    assert len(world.executions()) == 1


def test_a_digest_the_pipeline_rolled_back_is_not_rolled_forward_by_the_watcher(world):
    # given a digest an explicit run (not the watcher) tried and the pipeline rolled back
    from infra.lambdas.image_watcher.history import ROLLED_BACK

    digest = world.push(b"rolled back\n")
    world.history.record(event=ROLLED_BACK, digest=digest, execution_id="manual-1",
                         rolled_back_to="none", reason="smoke: FAILED")
    # then the watcher leaves it alone: only an explicit run deploys it again
    assert world.watch()["action"] == ALREADY_TRIED
    assert world.executions() == []


def test_a_new_digest_the_gpu_nodes_cannot_run_is_recorded_and_never_started(world, registry, pushed):
    """The tag moves to an index without linux/amd64 (the rule `lock` applies, one function):
    the watcher starts nothing and records why, once."""
    from oci_registry import OCI_MANIFEST

    from infra.lambdas.image_watcher.watcher import REJECTED

    arm64 = pushed["arm64"]
    index = registry.push_index(NAME, world.config.tag,
                                {"arm64": (arm64, registry.manifest_size(NAME, arm64, OCI_MANIFEST))})
    result = world.watch()
    assert result["action"] == REJECTED and "without linux/amd64 (it has: linux/arm64)" in result["reason"]
    assert world.executions() == []
    [event] = list(world.history.events())
    assert (event["event"], event["digest"]) == (REJECTED, index)
    assert world.watch()["action"] == ALREADY_TRIED and world.executions() == []
