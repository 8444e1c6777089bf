"""training/run_logs.py: scratch keyed by the run's storage location; the log copy never fails a run."""
from __future__ import annotations

import json

from training.run_logs import RUN_LOGS_DIR, copy_cluster_logs, scratch_key


def test_two_runs_of_one_name_get_two_scratch_folders_and_a_resume_gets_its_own_back():
    a = scratch_key("s3://bucket-a/runs/local", "local")
    b = scratch_key("s3://bucket-b/runs/local", "local")
    assert a != b and a.startswith("local-") and b.startswith("local-")
    assert scratch_key("s3://bucket-a/runs/local/", "local") == a  # same location, same folder


def test_without_ray_the_copy_names_why_and_writes_its_index(tmp_path, monkeypatch):
    import ray

    monkeypatch.setattr(ray, "nodes", lambda: (_ for _ in ()).throw(RuntimeError("Ray is not initialized")))
    index = copy_cluster_logs(str(tmp_path / "run"))
    assert index["copied"] == [] and "Ray is not initialized" in index["absent"]["*"]
    assert json.loads((tmp_path / "run" / RUN_LOGS_DIR / "index.json").read_text()) == index
    assert copy_cluster_logs("") == {"copied": [], "absent": {}}
