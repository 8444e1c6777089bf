"""The health gate (training/watchdog.py ``judge_gate``, ``health_gate``, ``Watchdog._gate_failed``):
its decision from the device readings, and the incident it writes. The device readings are
injected (a GPU's GEMM rate, nvidia-smi's CSV answer); everything after them runs as on a GPU.

nvidia-smi's answers below are in the format ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``
and ``--query-remapped-rows=...`` print (one GPU per line, fields in the order asked, ``[N/A]`` for a
field the GPU does not support: the L4 has no page retirement, it remaps rows)."""
from __future__ import annotations

import json

import pytest

from training import contract, incidents, verdict, watchdog
from training.run_record import RunRecord

L4_PEAK = 121.0
HEALTHY = {"gemm_tflops": 54.9, "gpus": "0, GPU-aaaa, 0, [N/A]\n1, GPU-bbbb, 0, [N/A]\n",
           "remapped_rows": "GPU-aaaa, No, No\nGPU-bbbb, No, No\n"}


def test_a_healthy_l4_passes():
    assert watchdog.judge_gate(HEALTHY, L4_PEAK) == []


def test_a_slow_gemm_fails_with_its_figure_and_bound():
    [found] = watchdog.judge_gate({**HEALTHY, "gemm_tflops": 20.0}, L4_PEAK)
    assert "20.0 TFLOP/s < bound 30.2" in found and "0.25 x peak 121" in found


def test_the_bound_passes_the_published_l4_rate_with_room_for_its_spread():
    # The published L4 square-GEMM rates the preflight uses (54-71 TFLOP/s by size) all pass;
    # half of the lowest fails.
    from raytrain_eks.planning.gpu_figures import L4_GEMM_TFLOPS

    for rate in L4_GEMM_TFLOPS.values():
        assert watchdog.judge_gate({**HEALTHY, "gemm_tflops": rate}, L4_PEAK) == []
    assert watchdog.judge_gate({**HEALTHY, "gemm_tflops": min(L4_GEMM_TFLOPS.values()) / 2.2}, L4_PEAK)


@pytest.mark.parametrize("gpus, remapped, expected", [
    ("0, GPU-aaaa, 2, [N/A]\n1, GPU-bbbb, 0, [N/A]\n", HEALTHY["remapped_rows"],
     "GPU 0: 2 uncorrectable ECC errors since the driver loaded (bound 0)"),
    ("0, GPU-aaaa, 0, Yes\n", "", "GPU 0: a retired page waits for a GPU reset"),
    (HEALTHY["gpus"], "GPU-aaaa, Yes, No\nGPU-bbbb, No, No\n", "GPU GPU-aaaa: a row remap waits for a GPU reset"),
    (HEALTHY["gpus"], "GPU-aaaa, No, No\nGPU-bbbb, No, Yes\n", "GPU GPU-bbbb: a row remap failed"),
])
def test_gpu_memory_errors_fail_the_node(gpus, remapped, expected):
    [found] = watchdog.judge_gate({**HEALTHY, "gpus": gpus, "remapped_rows": remapped}, L4_PEAK)
    assert found.startswith(expected)


def test_a_device_call_that_failed_is_a_finding_and_no_peak_leaves_the_gemm_unjudged():
    assert watchdog.judge_gate({**HEALTHY, "error": "TimeoutExpired: nvidia-smi"}, L4_PEAK) == [
        "device check failed: TimeoutExpired: nvidia-smi"]
    assert watchdog.judge_gate({**HEALTHY, "gemm_tflops": 1.0}, None) == []
    assert watchdog.judge_gate(None, L4_PEAK) == []  # a CPU worker: no GPU to prove


def test_a_cpu_worker_reads_nothing_unless_its_node_holds_injected_readings(tmp_path, monkeypatch):
    monkeypatch.delenv(contract.ENV_GATE_DEVICE, raising=False)
    assert watchdog.device_readings(False, None) is None
    path = tmp_path / "device.json"
    path.write_text(json.dumps({"gpus": "0, GPU-aaaa, 3, [N/A]\n"}))
    monkeypatch.setenv(contract.ENV_GATE_DEVICE, str(path))
    found = watchdog.device_readings(False, None)
    assert found["gpus"] == "0, GPU-aaaa, 3, [N/A]\n" and found["gemm_tflops"] is None


def test_the_gate_raises_one_line_naming_the_node_and_the_figure(tmp_path, monkeypatch):
    path = tmp_path / "device.json"
    path.write_text(json.dumps({**HEALTHY, "gemm_tflops": 12.5}))
    monkeypatch.setenv(contract.ENV_GATE_DEVICE, str(path))
    monkeypatch.setenv(contract.ENV_PEAK_TFLOPS, "121")
    monkeypatch.setenv(contract.ENV_NODE_NAME, "ip-10-0-0-7")
    with pytest.raises(watchdog.GateFailed) as err:
        watchdog.health_gate(watchdog.Progress(None, 0, 1), on_gpu=False, device=None)
    assert str(err.value).startswith("health gate: node ip-10-0-0-7 failed: bf16 GEMM 4096^3 at 12.5 TFLOP/s < bound 30.2")
    assert "\n" not in str(err.value)
    path.write_text(json.dumps(HEALTHY))
    assert watchdog.health_gate(watchdog.Progress(None, 0, 1), on_gpu=False, device=None) >= 0.0


FAKE_NVIDIA_SMI = """#!/bin/sh
# Test double of nvidia-smi's CSV query mode (NVIDIA's nvidia-smi: ``--query-gpu`` /
# ``--query-remapped-rows`` with ``--format=csv,noheader,nounits``: one line per GPU, the fields
# in the order asked). It answers only the exact queries the gate must ask.
echo "$@" >> "$(dirname "$0")/calls"
case "$1" in
  --query-gpu=index,uuid,ecc.errors.uncorrected.volatile.total,retired_pages.pending)
    printf '0, GPU-aaaa, 0, [N/A]\n1, GPU-bbbb, 4, [N/A]\n' ;;
  --query-remapped-rows=gpu_uuid,remapped_rows.pending,remapped_rows.failure)
    [ -n "$HANG" ] && exec sleep 5  # exec: the timeout's kill ends it, no orphan left
    printf 'GPU-aaaa, No, No\nGPU-bbbb, Yes, No\n' ;;
  *) echo "unknown query $1" >&2; exit 2 ;;
esac
"""


def _fake_nvidia_smi(tmp_path, monkeypatch):
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(FAKE_NVIDIA_SMI)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:{__import__('os').environ['PATH']}")
    monkeypatch.delenv(contract.ENV_GATE_DEVICE, raising=False)
    return tool.parent / "calls"


@pytest.mark.subprocess
def test_on_a_gpu_the_gate_asks_nvidia_smi_and_times_the_gemm(tmp_path, monkeypatch):
    # The GPU path on CPU: only the device calls stand in (the GEMM's rate; nvidia-smi's answers
    # from a stand-in executable that accepts only the exact queries), the rest runs as on a GPU.
    calls = _fake_nvidia_smi(tmp_path, monkeypatch)
    monkeypatch.setattr(watchdog, "gemm_tflops", lambda device: 21.0)
    found = watchdog.device_readings(True, "cuda:0")
    assert "error" not in found and len(calls.read_text().splitlines()) == 2
    assert watchdog.judge_gate(found, L4_PEAK) == [
        "bf16 GEMM 4096^3 at 21.0 TFLOP/s < bound 30.2 (0.25 x peak 121)",
        "GPU 1: 4 uncorrectable ECC errors since the driver loaded (bound 0)",
        "GPU GPU-bbbb: a row remap waits for a GPU reset"]


@pytest.mark.subprocess
def test_an_nvidia_smi_that_hangs_fails_the_node_and_one_missing_from_the_image_does_not(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, monkeypatch)
    monkeypatch.setattr(watchdog, "gemm_tflops", lambda device: 60.0)
    monkeypatch.setattr(watchdog, "NVIDIA_SMI_TIMEOUT_S", 1.0)
    monkeypatch.setenv("HANG", "1")
    found = watchdog.judge_gate(watchdog.device_readings(True, "cuda:0"), L4_PEAK)
    assert found[0].startswith("device check failed: TimeoutExpired") and "4 uncorrectable ECC" in found[1]
    # no nvidia-smi in the image: the image's property, never a node's finding (it would drain
    # every node in turn); the GEMM is still judged
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    readings = watchdog.device_readings(True, "cuda:0")
    assert readings["unchecked"].startswith("nvidia-smi not found") and watchdog.judge_gate(readings, L4_PEAK) == []
    monkeypatch.setattr(watchdog, "gemm_tflops", lambda device: 9.0)
    [found] = watchdog.judge_gate(watchdog.device_readings(True, "cuda:0"), L4_PEAK)
    assert found.startswith("bf16 GEMM 4096^3 at 9.0 TFLOP/s")


def _rank(pid: int, step, start=None, node: str = "node-a") -> dict:
    return {"pid": pid, "node_id": "n-" + node, "host": "h", "node": node, "stack_file": "/x", "start_step": start,
            "step": step, "t": 0.0}


GATE = {"node": "node-b", "failed": ["GPU 0: 2 uncorrectable ECC errors since the driver loaded (bound 0)"],
        "kept_out": "kept out of the next attempt (Ray node drained)", "seconds": 0.4, "t": 121.0}


@pytest.mark.parametrize("ray_first", [False, True])
def test_a_failed_gate_is_one_incident_naming_node_rank_figure_and_cost(tmp_path, ray_first):
    record = RunRecord(str(tmp_path / "run"), environ={})
    record.start(job_config={"name": "j"}, is_infrastructure_check=False)
    watch = watchdog.Watchdog(run_name="j", run_dir=str(tmp_path / "run"), record=record, max_steps=16,
                              world_size=2, on_gpu=True)
    # attempt 2 (after a fault at step 7): rank 1's gate fails on node-b before the restore
    done = {s: 100.0 + 2 * s for s in range(1, 8)}
    state = {"attempt": 1, "ranks": {0: _rank(10, None), 1: _rank(11, None, node="node-b")}, "min_step_at": {},
             "first_done": done, "heavy": [], "started": {1: 120.0}, "errors": {}, "gates": {}}
    watch.check(state, now=120.5)
    error = {1: {1: {"classes": ["GateFailed"], "text": "health gate: node node-b failed", "preempted": False}}}
    seen = [{**state, "errors": error}, {**state, "errors": error, "gates": {1: {1: GATE}}}]
    if not ray_first:
        seen = [{**state, "gates": {1: {1: GATE}}}, seen[1]]
    for s in seen:
        watch.check(s, now=122.0)
        watch.check(s, now=124.0)
    [entry] = record.data[contract.INCIDENTS]
    assert (entry["kind"], entry["ranks"], entry["nodes"], entry["step"]) == ("health_gate", [1], ["node-b"], 7)
    assert "2 uncorrectable ECC errors" in entry["detail"] and "(bound 0)" in entry["detail"]
    assert "kept out of the next attempt" in entry["detail"] and "then Ray Train saw" in entry["detail"]
    # the next attempt (node-b kept out) restores step 5, first step at t=160
    second = {**state, "attempt": 2, "ranks": {0: _rank(20, 5, 5), 1: _rank(21, 5, 5, node="node-c")},
              "started": {1: 120.0, 2: 140.0}, "gates": {1: {1: GATE}}, "errors": error}
    watch.check(second, now=141.0)
    watch.check({**second, "min_step_at": {6: 160.0}}, now=161.0)
    [entry] = json.loads((tmp_path / "run" / "run.json").read_text())[contract.INCIDENTS]
    assert entry["resumed_from_step"] == 5 and entry["steps_lost"] == 2
    assert entry["progress_again_s"] == 38.0 and entry["devices"] == 2 and entry["gpu_minutes_lost"] > 0
    assert "health_gate of rank 1 on node-b" in incidents.line(entry)
    final = record.finish(status="succeeded")
    assert "after 1 incident (1 health_gate)" in verdict.headline(final["verdict"])


def test_the_wait_for_a_replacement_is_bounded_and_its_end_names_the_node():
    # Ray Train retries a worker group it cannot place without a limit by default
    # (FailureConfig.controller_failure_limit = -1, ray 2.58 train/v2/api/config.py).
    from training import launch

    # The limit counts retries: Ray Train raises on the failure past it (ray 2.58
    # failure_handling/default.py: error_count > retry_limit), so 20 tries of 60 s are 19 retries.
    assert launch.placement_retries({}) == 19  # 1200 s in 60 s start timeouts
    assert launch.placement_retries({contract.ENV_REPLACEMENT_WAIT_S: "300",
                                     "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "120"}) == 2
    assert launch.placement_retries({contract.ENV_REPLACEMENT_WAIT_S: "10"}) == 0  # the first timeout ends it
    kept = [incidents.incident(incidents.HEALTH_GATE, ranks=[1], nodes=["node-b"], detail="ECC")]
    # what the fit raises once Ray Train gave up placing the group (ray 2.58's own classes)
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError
    from ray.train.v2.api.exceptions import ControllerError

    error = ControllerError(WorkerGroupStartupTimeoutError(2))
    assert launch.unplaced_reason(error, kept, {}) == (
        "no capacity for the worker group after health_gate of node node-b: not placed within 1200 s "
        f"(20 x the 60 s start timeout; {contract.ENV_REPLACEMENT_WAIT_S})")
    assert launch.unplaced_reason(RuntimeError("a bug"), kept, {}) == ""


def test_a_nodes_injected_readings_never_reach_every_worker():
    from training import launch

    env = launch.forwarded_env({contract.ENV_GATE_DEVICE: "/x.json", contract.ENV_HANG_FLOOR_S: "60"})
    assert contract.ENV_GATE_DEVICE not in env and env[contract.ENV_HANG_FLOOR_S] == "60"
