"""``raytrain-eks summary`` says where the runs are: the bucket, or the spec's shared file system
beside it (``storage.shared_path``, training/storage/__init__.py)."""
from __future__ import annotations

from spec_template import template_raw

from environment import environment_from_dict
from raytrain_eks.verify import render_summary


def _storage_lines(**storage) -> list[str]:
    raw = template_raw()
    raw["cluster"]["account"] = "111122223333"
    raw["storage"].update(storage)
    lines = render_summary(environment_from_dict(raw)).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("storage "))
    return [lines[start]] + ([lines[start + 1]] if lines[start + 1].startswith(" ") else [])


def test_the_runs_in_the_bucket():
    assert _storage_lines() == [
        "storage      s3://raytrain-raytrain-111122223333-us-east-1/runs  (noncurrent versions kept 30 d)"]


def test_the_runs_on_a_shared_file_system_beside_the_bucket():
    storage, shared = _storage_lines(shared_path="/fsx/runs", shared_claim="fsx-runs")
    assert storage.startswith("storage      s3://") and shared.startswith(
        "             runs on file:///fsx/runs: claim fsx-runs mounted on every Ray pod")
