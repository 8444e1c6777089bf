"""The step-time traces (bench/bench_step_model.py ``trace``) are keyed by activation
checkpointing: a checkpointed micro batch runs every block's forward again in backward
(training/parallel.py: non-reentrant ``gradient_checkpointing_enable``), and a job is predicted
only from a trace of its own kind (raytrain_eks/planning/step_model.py ``find_trace``)."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))


def test_a_checkpointed_trace_holds_the_recomputed_forward(monkeypatch):
    import bench_step_model
    from raytrain_eks.planning.measured_plan import MODEL_CONFIGS

    tiny = dict(MODEL_CONFIGS[bench_step_model.MODEL], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2)
    monkeypatch.setitem(MODEL_CONFIGS, bench_step_model.MODEL, tiny)
    plain, checkpointed = (bench_step_model.trace("chat", 256, 1, activation_checkpointing=ac) for ac in (False, True))
    assert (plain["activation_checkpointing"], checkpointed["activation_checkpointing"]) == (False, True)
    flops = lambda t: sum(2 * m * n * k * count for m, n, k, count in t["gemms"])
    assert flops(checkpointed) > flops(plain)
    assert checkpointed["attention_flops"] > plain["attention_flops"]


def test_a_job_is_predicted_only_from_a_trace_of_its_own_checkpointing():
    from raytrain_eks.planning.step_model import find_trace

    old = {"model": "m", "kind": "chat", "seq_len": 2048, "micro_batch_size": 1}  # published before the key
    key = dict(model="m", kind="chat", seq_len=2048, micro_batch_size=1)
    assert find_trace([old], **key) is old
    assert find_trace([old], **key, activation_checkpointing=True) is None
    on = {**old, "activation_checkpointing": True}
    assert find_trace([old, on], **key, activation_checkpointing=True) is on


def test_the_trace_checkpoints_with_the_job_s_own_function(monkeypatch):
    """One definition: the trace checkpoints the layers through training/parallel.py's
    ``checkpoint_activations`` (what ``parallelize`` calls), so a change to how the job
    checkpoints changes the traced recompute with it."""
    import bench_step_model
    from raytrain_eks.planning.measured_plan import MODEL_CONFIGS
    from training import parallel

    tiny = dict(MODEL_CONFIGS[bench_step_model.MODEL], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2)
    monkeypatch.setitem(MODEL_CONFIGS, bench_step_model.MODEL, tiny)
    applied = []
    monkeypatch.setattr(parallel, "checkpoint_activations", lambda model: applied.append(model))
    traced = bench_step_model.trace("chat", 256, 1, activation_checkpointing=True)
    assert len(applied) == 1
    # nothing checkpointed by the spy: the recompute is gone, so the trace followed the function
    assert traced["gemms"] == bench_step_model.trace("chat", 256, 1, activation_checkpointing=False)["gemms"]
