"""A job chooses the environment's GPU node group it runs on (``parallel.node_group``): adding a
p5.48xlarge group that a job can choose is one table in environment.toml and one line in the job."""
from __future__ import annotations

from pathlib import Path

import pytest
from charts_testspec import ROOT, spec_raw

from charts.code_bundle import CodeBundle
from charts import ChartError
from charts.jobs import plan_job
from charts.ray_charts import rayjob_spec
from environment import environment_from_dict
from environment.contract import EFA_RESOURCE, GPU_RESOURCE

P5_JOB = """
name = "on-p5"
[model]
config = {{ hidden_size = 64, intermediate_size = 128, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, vocab_size = 1024, max_position_embeddings = 512 }}
[data]
kind = "synthetic"
[train]
seq_len = 128
micro_batch_size = 1
global_batch_size = 16
max_steps = 20
[parallel]
use_gpu = true
node_group = "{group}"
"""


def two_group_env():
    raw = spec_raw()
    raw["gpu_node_groups"].append({"name": "p5", "instance_type": "p5.48xlarge", "min_nodes": 2,
                                   "desired_nodes": 2, "max_nodes": 2})
    return environment_from_dict(raw, source="two-groups.toml")


def test_a_job_that_names_the_p5_group_is_sized_and_placed_there(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    job = tmp_path / "on-p5.toml"
    job.write_text(P5_JOB.format(group="p5"))
    env = two_group_env()
    plan = plan_job(env, job, ROOT)
    assert (plan.node_group, plan.worker_replicas) == ("p5", 2)
    assert (plan.config.parallel.num_workers, plan.config.parallel.workers_per_node) == (16, 8)
    code = CodeBundle(path=Path("training-0000000000000000.zip"), content_hash="0" * 16, files=1)
    spec = rayjob_spec(env, plan, code, None)
    (group,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    pod = group["template"]["spec"]
    (container,) = pod["containers"]
    assert group["groupName"] == "p5" and pod["nodeSelector"]["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert container["resources"]["limits"][GPU_RESOURCE] == "8" and container["resources"]["limits"][EFA_RESOURCE] == "32"
    env_vars = {e["name"]: e.get("value") for e in container["env"]}  # some come from the downward API
    assert env_vars["RAYTRAIN_PEAK_BF16_TFLOPS"] == "989" and env_vars["FI_EFA_USE_DEVICE_RDMA"] == "1"
    # The default group is untouched: a job that names none still runs on the first group.
    job.write_text(P5_JOB.format(group=""))
    assert plan_job(env, job, ROOT).node_group == "gpu"


def test_an_unknown_node_group_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    job = tmp_path / "typo.toml"
    job.write_text(P5_JOB.format(group="p6"))
    with pytest.raises(ChartError) as err:
        plan_job(two_group_env(), job, ROOT)
    assert str(err.value) == (f"{job}: parallel.node_group: 'p6' is not a GPU node group of two-groups.toml "
                              "(known: gpu, p5)")
