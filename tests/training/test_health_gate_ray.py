"""The health gate on real Ray: a node whose GPU reports memory errors is named in run.json and
kept out of the next attempt, and the run goes on on a replacement.

The session's Ray cluster (tests/conftest.py ``ray_cluster``, 4 CPUs) plus a node started with
``ray start --address`` (3 CPUs) whose raylet's environment carries the device readings a GPU
with 2 uncorrectable ECC errors gives (``RAYTRAIN_GATE_DEVICE``: nvidia-smi's CSV answer, the
only thing injected; as the downward API names a pod's node, ``RAYTRAIN_NODE_NAME`` names it).
The job (tiny Qwen2, synthetic tokens, 2 workers of 3 CPUs: one on each node) is started as
``python -m training`` against that cluster. The worker on the bad node fails its gate before
its model build, the node is drained, and once the incident is in run.json a healthy node joins
(the replacement KubeRay's autoscaler would start): the bad node has left the cluster (a
draining raylet exits once idle), the second attempt runs on the head and the new node only, and
the run ends ACCEPTED with the incident in its verdict.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ray_session import TEST_ENV
from test_elastic_spot_ray import _kill_node, _notes, _start_node, _wait

from training import verdict

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ECC = {"gpus": "0, GPU-0f1e2d3c, 2, [N/A]\n", "remapped_rows": "GPU-0f1e2d3c, No, No\n"}
JOB = """name = "gate"
[model]
config = {{ hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 2, num_key_value_heads = 1, intermediate_size = 64, vocab_size = 512, max_position_embeddings = 128, tie_word_embeddings = true }}
[data]
kind = "synthetic"
[train]
seq_len = 32
micro_batch_size = 1
global_batch_size = 2
max_steps = 4
lr = 3e-3
warmup_steps = 1
log_every_n_steps = 1
report_every_n_steps = 1
[parallel]
strategy = "full_shard"
num_workers = 2
workers_per_node = 1
cpus_per_worker = 3
use_gpu = false
[checkpoint]
storage_path = "{storage}"
run_name = "gate"
every_n_steps = 2
keep_last = 1
max_failures = 2
export_hf = false
[eval]
max_batches = 1
[evidence]
require_transport = "any"
"""


def _incidents(run_dir: Path) -> list[dict]:
    try:
        return json.loads((run_dir / "run.json").read_text()).get("incidents") or []
    except (OSError, ValueError):
        return []


def test_a_node_failing_the_gate_is_recorded_and_kept_out_of_the_next_attempt(ray_cluster, tmp_path):
    gcs = ray_cluster.get_runtime_context().gcs_address
    device = tmp_path / "device.json"
    device.write_text(json.dumps(ECC))
    bad = _start_node(SimpleNamespace(gcs_address=gcs, client_env={"RAYTRAIN_GATE_DEVICE": str(device),
                                                                   "RAYTRAIN_NODE_NAME": "node-bad"}),
                      tmp_path, "node-bad", cpus=3)
    bad_id = next(n["NodeID"] for n in ray_cluster.nodes() if n["NodeManagerPort"] == bad.port)
    good = None
    job = tmp_path / "gate.toml"
    job.write_text(JOB.format(storage=tmp_path / "store"))
    run_dir = tmp_path / "store" / "gate"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYTRAIN_")}
    env.update(RAYTRAIN_HANG_FLOOR_S=TEST_ENV["RAYTRAIN_HANG_FLOOR_S"], RAY_ADDRESS=gcs, RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S="240",
               RAYTRAIN_CHECKPOINT_LOCAL_DIR=str(tmp_path / "scratch"))
    began = time.time()
    run = subprocess.Popen([sys.executable, "-m", "training", "--config", str(job)], cwd=ROOT, env=env,
                           stdout=open(tmp_path / "gate.out", "w"), stderr=subprocess.STDOUT)
    try:
        _wait("the gate's incident", lambda: any(i["kind"] == "health_gate" for i in _incidents(run_dir)), 600, run)
        seen = time.time() - began
        good = _start_node(SimpleNamespace(gcs_address=gcs, client_env={"RAYTRAIN_NODE_NAME": "node-good"}),
                           tmp_path, "node-good", cpus=3)
        assert run.wait(timeout=600) == 0, (tmp_path / "gate.out").read_text()[-4000:]
        # a draining raylet exits once idle: the bad node leaves the cluster by itself (waited
        # for: the GCS marks it dead a moment after the run's end; the bound only ends a hang)
        deadline = time.monotonic() + 300
        while (bad_alive := next(n["Alive"] for n in ray_cluster.nodes() if n["NodeID"] == bad_id)) \
                and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        if run.poll() is None:
            run.kill()
        # each node killed whole; nothing of either runs on after the test (its log monitor neither)
        left = {node.port: _kill_node(node) for node in (bad, good) if node is not None}
    assert left == {bad.port: [], good.port: []}, left
    print(f"gate incident in run.json {seen:.0f} s after the driver started; run took {time.time() - began:.0f} s")
    record = json.loads((run_dir / "run.json").read_text())
    [entry] = record["incidents"]
    assert (entry["kind"], entry["nodes"]) == ("health_gate", ["node-bad"])
    assert "GPU 0: 2 uncorrectable ECC errors since the driver loaded (bound 0)" in entry["detail"]
    assert "kept out of the next attempt (Ray node drained)" in entry["detail"]
    assert entry["resumed_from_step"] == 0 and entry["device_minutes_lost"] is not None
    # the second attempt ran without the bad node: no rank of it on the node the gate failed
    assert bad_alive is False
    starts = [n for n in _notes(run_dir) if n["note"] == "start"]
    assert len(starts[-1]["nodes"]) == 2 and bad_id not in starts[-1]["nodes"], (bad_id, starts)
    assert record["verdict"]["verdict"] == verdict.ACCEPTED and record["verdict"]["incidents"] == 1
    assert "after 1 incident (1 health_gate)" in verdict.headline(record["verdict"])


def test_the_gates_report_lands_even_when_the_threaded_board_runs_it_before_the_registration(ray_cluster):
    """The board is a threaded actor, and Ray keeps no order between one caller's calls to such an
    actor (Ray's docs, ray-core/actors/task-orders: "Asynchronous or Threaded Actor"). Here the
    rank's registration waits on an argument not yet computed, so the board runs the gate's report
    first; the report must still land (before the fix it was dropped as a rank not registered,
    and a full run recorded the gate's node as lost, not as failing its gate)."""
    from training import watchdog

    @ray_cluster.remote(num_cpus=0)
    def later(info: dict) -> dict:
        time.sleep(3)  # the registration's argument is not ready before the gate's report is sent
        return info

    board = watchdog._board_actor(ray_cluster.get_runtime_context().get_node_id(), f"gate-order-{os.getpid()}")
    try:
        # the board and a task worker up first: the rank's wait for its registration is bounded
        # (30 s, training/watchdog.py), and a loaded machine can take longer to start a worker
        ray_cluster.get([board.__ray_ready__.remote(), later.remote({})], timeout=600)
        info = later.remote({"pid": 4242, "node_id": "n", "actor_id": "", "host": "h", "node": "node-x",
                             "stack_file": "", "start_step": None, "trace_prefix": ""})
        registered = board.begin.remote(1, info, time.time())
        watchdog.Progress(board, 1, 4242, registered).gate_failed(
            {"node": "node-x", "failed": ["GPU 0: ECC"], "kept_out": "kept out", "seconds": 0.1})
        state = ray_cluster.get(board.state.remote())
        assert state["gates"] == {1: {1: {"node": "node-x", "failed": ["GPU 0: ECC"], "kept_out": "kept out",
                                          "seconds": 0.1, "t": state["gates"][1][1]["t"]}}}, state
    finally:
        ray_cluster.kill(board)
