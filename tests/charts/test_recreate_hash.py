"""Which edits kill the long-lived RayCluster: KubeRay's Recreate upgrade deletes every pod when
the hash of its spec changes (charts_oracles/recreate_hash.py). Editing ``[prices]`` or
``[pipeline]`` or adding a job must not; a new image digest must (that is the upgrade)."""
from __future__ import annotations

import shutil

import pytest
import yaml
from charts_oracles.recreate_hash import recreate_hash
from charts_testspec import ROOT, make_env, spec_raw
from fixture_paths import FIXTURE_JOBS

EXTRA_JOB = '''name = "extra"
[model]
config = { hidden_size = 64, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, intermediate_size = 128, vocab_size = 151936, max_position_embeddings = 2048 }
tokenizer = "training/assets/qwen2.5-tokenizer"
[data]
kind = "synthetic"
[parallel]
use_gpu = true
[checkpoint]
sigterm_grace_seconds = 500
'''


def raycluster_hash(env, tmp_path, jobs=FIXTURE_JOBS) -> str:
    from charts.main import synth

    result = synth(env, tmp_path / "dist", root=ROOT, jobs=jobs)
    (rc,) = [d for d in yaml.safe_load_all(result.files["raycluster"].read_text()) if d]
    return recreate_hash(rc["spec"])


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> str:
    return raycluster_hash(make_env(), tmp_path_factory.mktemp("base"))


def test_prices_and_pipeline_edits_leave_the_cluster_alone(baseline, tmp_path):
    raw = spec_raw()
    raw["prices"] = {"g6.12xlarge": 1.23}
    raw["pipeline"] = {"connection_arn": "arn:aws:codeconnections:us-east-1:111122223333:connection/" + "0" * 8 + "-0000-0000-0000-" + "0" * 12,
                       "repository": "me/repo", "min_tokens_per_s_fraction": 0.5}
    env = make_env(raw)
    assert env.spec_hash != make_env().spec_hash  # the spec did change
    assert raycluster_hash(env, tmp_path) == baseline


def jobs_with(tmp_path, job_text: str):
    """A copy of the fixture jobs with one more job config."""
    jobs = tmp_path / "jobs"
    shutil.copytree(FIXTURE_JOBS, jobs)
    (jobs / "extra.toml").write_text(job_text)
    return jobs


def test_adding_a_job_leaves_the_cluster_alone(baseline, tmp_path):
    # its checkpoint grace (500 s) is longer than any shipped job's, yet the cluster's is fixed
    assert raycluster_hash(make_env(), tmp_path, jobs=jobs_with(tmp_path, EXTRA_JOB)) == baseline


def test_a_job_longer_than_the_cluster_grace_is_refused_in_one_line(tmp_path):
    from charts import ChartError

    jobs = jobs_with(tmp_path, EXTRA_JOB.replace("= 500", "= 900"))
    with pytest.raises(ChartError) as err:
        raycluster_hash(make_env(), tmp_path, jobs=jobs)
    assert str(err.value) == ("jobs/extra.toml: checkpoint.sigterm_grace_seconds: 900 is longer than the long-lived "
                              "RayCluster's workers wait on SIGTERM (at most 600): its -on-cluster RayJob would be "
                              "killed inside its final checkpoint")


def test_a_new_image_digest_recreates_the_cluster(baseline, tmp_path):
    raw = spec_raw()
    raw["image"]["digest"] = "sha256:" + "f" * 64
    assert raycluster_hash(make_env(raw), tmp_path) != baseline
