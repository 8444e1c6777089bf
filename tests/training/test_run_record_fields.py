"""run.json: every field, at start and at the end, on a local path and on S3 (moto)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_runs_s3 import _moto_server, moto_s3  # noqa: F401  (fixtures)

from training import run_record
from training import contract as c
from training.contract import RECORD_FIELDS as FIELDS
from training.run_record import RunRecord
from training.storage.files import read_json

ENV = {
    c.ENV_IMAGE: "public.ecr.aws/deep-learning-containers/ray@sha256:" + "ab" * 32,
    c.ENV_CODE_HASH: "cd" * 8,
    c.ENV_SPEC_HASH: "ef" * 8,
    c.ENV_JOB_CONFIG_HASH: "12" * 8,
    c.ENV_INSTANCE_TYPE: "g6.12xlarge",
    c.ENV_CLUSTER: "raytrain",
}


def test_training_modules_import_without_torch_or_ray():
    code = ("import sys; import training.flops, training.transport, training.run_record, training.run_facts, "
            "training.run_logs, training.storage.files; "
            "bad = {'torch', 'ray', 'pyarrow', 'transformers', 'spec'} & set(sys.modules); print(sorted(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_record_holds_every_field_at_start_and_end(tmp_path):
    record = RunRecord(str(tmp_path / "run"), environ=ENV)
    record.start(job_config={"name": "smoke", "data": {"kind": "synthetic"}}, is_infrastructure_check=True,
                 cluster={"nodes": 2, "gpus_per_node": 4, "world_size": 8},
                 versions={"python": "3.13.0"}, command=["python", "-m", "training", "--config", "x.toml"])
    first = json.loads((tmp_path / "run" / "run.json").read_text())
    assert set(first) == set(FIELDS)
    assert first["status"] == "running" and first["end_time"] is None
    assert first["kind"] == "infrastructure_check" and first["is_infrastructure_check"] is True
    assert first["image"] == ENV[c.ENV_IMAGE] and first["image_digest"] == "sha256:" + "ab" * 32
    assert first["code_hash"]["manifest"] == ENV[c.ENV_CODE_HASH]
    assert first["code_hash"]["ran"] == run_record.code_hash()
    assert first["spec_hash"] == ENV[c.ENV_SPEC_HASH]
    assert first["job_config_hash"]["manifest"] == "12" * 8 and first["job_config_hash"]["ran"].startswith("sha256:")
    assert first["cluster"] == {"instance_type": "g6.12xlarge", "cluster": "raytrain", "nodes": 2,
                                "gpus_per_node": 4, "world_size": 8}
    assert first["command"][-1] == "x.toml"

    record.update(hosts={"0": "ip-10-0-1-23", "4": "ip-10-0-1-57"},
                  transport={"transport": "efa", "ranks": [{"rank": 0, "ofi_nccl_version": "1.20.0",
                                                             "nccl_version": "2.29.7+cuda13.0"}]},
                  throughput={"tokens_per_s": 530.0, "mfu": 0.01}, eval={"before": {"loss": 3.0, "ppl": 20.1}},
                  checkpoints=["checkpoint_000004"])
    record.finish(status="succeeded", eval={"after": {"loss": 2.5, "ppl": 12.2}})
    final = json.loads((tmp_path / "run" / "run.json").read_text())
    assert set(final) == set(FIELDS)
    assert final["status"] == "succeeded" and final["exit_code"] == 0 and final["error"] is None
    assert final["eval"] == {"before": {"loss": 3.0, "ppl": 20.1}, "after": {"loss": 2.5, "ppl": 12.2}}
    assert final["hosts"]["4"] == "ip-10-0-1-57" and "driver" in final["hosts"]
    assert final["versions"] == {"python": "3.13.0", "aws_ofi_nccl": "1.20.0", "nccl": "2.29.7+cuda13.0"}
    assert final["verdict"] == {"verdict": "accepted", "criteria": [],
                                "reason": "completed; no [accept] criteria declared"}
    assert final["end_time"] >= final["start_time"] and final["duration_s"] >= 0


def test_failed_run_records_the_error_and_unknown_fields_are_refused(tmp_path):
    record = RunRecord(str(tmp_path), environ={})
    record.start(job_config={"name": "x"}, is_infrastructure_check=False, versions={})
    with pytest.raises(KeyError, match="no field 'colour'"):
        record.update(colour="blue")
    record.finish(status="failed", error="TransportError: rank 4 saw 'socket'")
    final = read_json(str(tmp_path / "run.json"))
    assert final["kind"] == "fine_tune" and final["image"] == "" and final["image_digest"] == ""
    assert final["status"] == "failed" and final["exit_code"] == 1 and "socket" in final["error"]


def test_collect_versions_reads_the_installed_stack_and_says_why_gpu_facts_are_absent():
    from training.run_facts import collect_versions

    versions = collect_versions(on_gpu=False)
    from importlib import metadata
    assert versions["ray"] == metadata.version("ray") and versions["torch"] == metadata.version("torch")
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert versions["kernel"] and versions["read_on"].startswith("rank-0 worker")
    # This machine has no GPU: every GPU fact is absent WITH its reason, never empty or guessed.
    for key in ("gpu", "nccl"):
        assert versions[key] == {"absent": "CPU run (gloo backend): no GPU, no NCCL"}
    for key in ("nvidia_driver", "efa_installer", "aws_ofi_nccl"):
        assert isinstance(versions[key], str) or versions[key].get("absent") or versions[key].get("path")


def test_finish_judges_the_record_against_its_declared_criteria(tmp_path):
    record = RunRecord(str(tmp_path), environ=ENV)
    record.start(job_config={"name": "x", "accept": {"eval_loss_after_max": 2.0, "transport": "efa"}},
                 is_infrastructure_check=False, versions={})
    record.update(transport={"transport": "efa", "ranks": []},
                  eval={"before": {"eval_loss": 3.0}, "after": {"eval_loss": 2.5}})
    final = record.finish(status="succeeded")
    assert final["verdict"]["verdict"] == "rejected" and final["verdict"]["criterion"] == "eval_loss_after_max"
    assert final["exit_code"] == 3
    assert final["source"]["git_commit"] == {"absent": "RAYTRAIN_GIT_COMMIT unset or the synth tree was no git checkout"}


def test_code_hash_changes_with_the_code(tmp_path):
    for folder in c.CODE_DIRS:
        (tmp_path / folder).mkdir()
    (tmp_path / "training" / "a.py").write_text("x = 1\n")
    before = run_record.code_hash(tmp_path)
    (tmp_path / "training" / "__pycache__").mkdir()
    (tmp_path / "training" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"compiled")
    assert run_record.code_hash(tmp_path) == before
    (tmp_path / "training" / "a.py").write_text("x = 2\n")
    assert run_record.code_hash(tmp_path) != before


@pytest.mark.subprocess  # charts/code_bundle.py starts a process to build the archive
def test_code_hash_equals_the_code_archive_hash_the_manifests_carry(tmp_path):
    from charts.code_bundle import build_code_bundle

    root = Path(run_record.__file__).resolve().parents[1]
    assert run_record.code_hash() == build_code_bundle(root, tmp_path).content_hash


def test_record_on_s3(moto_s3):
    record = RunRecord("s3://runs-111122223333/jobs/smoke", environ=ENV)
    record.start(job_config={"name": "smoke"}, is_infrastructure_check=True, versions={})
    record.finish(status="stopped", error="SIGTERM")
    final = read_json("s3://runs-111122223333/jobs/smoke/run.json")
    assert final["status"] == "stopped" and final["spec_hash"] == ENV[c.ENV_SPEC_HASH]


def test_a_retried_driver_keeps_the_earlier_drivers_incidents(tmp_path):
    """KubeRay retries a failed driver (RayJob ``backoffLimit`` > 0, v1.7.0): the new driver starts
    the record again at the same run directory; the faults the first one recorded must stay."""
    from training import incidents

    first = RunRecord(str(tmp_path / "run"), environ={})
    first.start(job_config={"name": "j"}, is_infrastructure_check=False)
    incidents.add(first, incidents.incident(incidents.HANG, ranks=[1], nodes=["node-b"], step=30, detail="no step"))
    second = RunRecord(str(tmp_path / "run"), environ={})
    data = second.start(job_config={"name": "j"}, is_infrastructure_check=False)
    assert [e["kind"] for e in data[c.INCIDENTS]] == [incidents.HANG]
    assert json.loads((tmp_path / "run" / "run.json").read_text())[c.INCIDENTS][0]["ranks"] == [1]
    fresh = RunRecord(str(tmp_path / "other"), environ={})
    assert fresh.start(job_config={"name": "j"}, is_infrastructure_check=False)[c.INCIDENTS] == []
