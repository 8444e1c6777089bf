"""Promote reads the smoke record the gate judged, and only this execution's: the URI must name
an object version (the Smoke action exports ``s3://...run.json?versionId=V``) and a run of this
execution (``smoke-<execution id>-<build>``), whose own ``run_dir`` agrees."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from raytrain_eks.pipeline.apply_promote import check_own_record
from raytrain_eks.pipeline.rollback import StepFailed

OWN = "s3://bucket/runs/smoke-exec-1-7/run.json"


def ctx(run_dir: str = "s3://bucket/runs/smoke-exec-1-7"):
    return SimpleNamespace(execution_id="exec-1", read_json=lambda uri: {"run_dir": run_dir})


def test_this_executions_record_at_a_version_passes():
    check_own_record(ctx(), OWN + "?versionId=v3")


@pytest.mark.parametrize("uri, run_dir, message", [
    (OWN, "s3://bucket/runs/smoke-exec-1-7", "names no object version"),
    ("s3://bucket/runs/smoke-exec-2-7/run.json?versionId=v1", "s3://bucket/runs/smoke-exec-2-7",
     "is not a run of execution exec-1"),
    ("s3://bucket/runs/smoke-exec-10-7/run.json?versionId=v1", "s3://bucket/runs/smoke-exec-10-7",
     "is not a run of execution exec-1"),  # a prefix of another execution's id is not its run
    (OWN + "?versionId=v1", "s3://bucket/runs/finetune", "says it is run 's3://bucket/runs/finetune'"),
])
def test_another_record_is_refused_and_not_the_images_fault(uri, run_dir, message):
    with pytest.raises(StepFailed, match=message) as refused:
        check_own_record(ctx(run_dir), uri)
    assert refused.value.failure == "infrastructure"
