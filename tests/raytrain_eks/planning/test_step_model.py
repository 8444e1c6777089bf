"""The step-time model (raytrain_eks/planning/step_model.py): each term from its figure, the range's ends,
the communication exposed by phase, and the preflight's lines for the shipped finetune.

The phase rule modelled for the root's reduce-scatter is FSDP2's (pytorch v2.13.0,
torch/distributed/fsdp/_fully_shard/_fsdp_state.py:421-431): the final callback of a backward
with ``is_last_backward`` True makes the compute stream wait for every retained reduce-scatter,
the root's (embeddings, run from that callback) included; with it False they run on.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from raytrain_eks.planning.gpu_figures import published
from raytrain_eks.planning.measured_plan import Cluster
from raytrain_eks.planning.step_model import COMM_TERMS, _root_params, exposed_comm, predict
from raytrain_eks.planning.measured_plan import MODEL_CONFIGS
from training.flops import ModelShapes

ROOT = Path(__file__).resolve().parents[3]
QWEN2_5_1_5B = ModelShapes.from_hf_config({"model_type": "qwen2", **MODEL_CONFIGS["Qwen2.5-1.5B"]})
GB = 1e9
TRACE = {"model": "m", "kind": "chat", "seq_len": 2048, "micro_batch_size": 1, "doc_lengths": [2048],
         "gemms": [[2048, 2048, 2048, 10]], "attention_flops": 0, "elementwise_bytes": int(30 * GB), "kernels": 1000,
         "model_flops": int(1e12)}


def _measured(accum=8, reduce_scatter_bytes=0.0, all_reduce_bytes=0.0):
    collectives = [{"kind": "reduce_scatter", "group_size": 4, "first_bytes": reduce_scatter_bytes,
                    "middle_bytes": reduce_scatter_bytes, "last_bytes": reduce_scatter_bytes}]
    if all_reduce_bytes:
        collectives.append({"kind": "all_reduce", "group_size": 2, "first_bytes": 0, "middle_bytes": 0,
                            "last_bytes": all_reduce_bytes})
    return {"strategy": "hybrid_shard", "grad_accum_steps": accum, "collectives": collectives}


def test_compute_terms_come_from_the_table_and_the_bandwidth():
    f = published("L4", 40)
    p = predict(TRACE, _measured(), Cluster(), QWEN2_5_1_5B, f)
    gemm_one = 10 * 2 * 2048**3
    assert p["terms"]["gemm_s"] == pytest.approx((8 * gemm_one / 70.9e12, 8 * gemm_one / 70.9e12), abs=1e-3)
    assert p["terms"]["elementwise_s"] == pytest.approx(
        (8 * 30 * GB / 300e9, 8 * (30 * GB / 240e9 + 1000 * 5e-6)), abs=1e-3)
    low, high = p["step_s"]
    assert low < high and p["mfu"][0] < p["mfu"][1]
    assert p["assumed"] == ["gemm", "memory", "kernel_floor_us", "pcie", "efa"]


def test_the_lever_exposes_the_roots_reduce_scatter_only_at_the_last_micro_batch():
    f = published("L4", 40)
    root_bytes = 4 * _root_params(QWEN2_5_1_5B)  # fp32, as the job reduces
    measured = _measured(reduce_scatter_bytes=root_bytes)  # only the root's: the layers' hide in backward
    trace = {**TRACE, "elementwise_bytes": int(200 * GB)}  # a forward longer than the root's reduce-scatter
    on = predict(trace, measured, Cluster(), QWEN2_5_1_5B, f, last_backward_lever=True)
    off = predict(trace, measured, Cluster(), QWEN2_5_1_5B, f, last_backward_lever=False)
    root_s = [root_bytes * 3 / 4 / (rate * GB) for rate in (12.0, 8.0)]  # ring over 4, fast and slow PCIe
    assert off["terms"]["backward_reduce_scatters_s"] == pytest.approx((8 * root_s[0], 8 * root_s[1]), abs=1e-3)
    assert on["terms"]["backward_reduce_scatters_s"] == pytest.approx((root_s[0], root_s[1]), abs=1e-3)


def test_the_steps_all_reduce_is_exposed_beyond_the_last_backward():
    f = published("L4", 40)
    p = predict(TRACE, _measured(all_reduce_bytes=40 * GB), Cluster(), QWEN2_5_1_5B, f)
    # 4 GPUs of a node share its EFA link: 4 x 40 GB x 2 x 1/2 = 160 GB at 5 / 3 GB/s
    fast, slow = p["terms"]["step_all_reduce_s"]
    assert 160 / 5 - 1 < fast <= 160 / 5 and 160 / 3 - 1.5 < slow <= 160 / 3


def test_a_plan_measured_over_two_micro_batches_repeats_the_first_in_the_middle():
    # bench_full_size_plan.py measures re-gathering plans over 2 micro batches: no middle_bytes.
    # Read as measured_plan.predict reads them (the middle repeats the first), not as silence.
    f = published("L4", 40)
    full = _measured(reduce_scatter_bytes=2 * GB)
    two = {**full, "collectives": [{k: v for k, v in c.items() if k != "middle_bytes"} for c in full["collectives"]]}
    assert predict(TRACE, two, Cluster(), QWEN2_5_1_5B, f) == predict(TRACE, full, Cluster(), QWEN2_5_1_5B, f)


def test_the_exposed_communication_is_the_collective_terms_share_of_the_step():
    """run.json's ``exposed_comm`` (label ``predicted``): the phases' exposed collectives summed,
    over the step, at each end of the range."""
    p = predict(TRACE, _measured(reduce_scatter_bytes=2 * GB, all_reduce_bytes=1 * GB), Cluster(), QWEN2_5_1_5B,
                published("L4", 40))
    comm = [sum(p["terms"][name][end] for name in COMM_TERMS) for end in (0, 1)]
    e = exposed_comm(p)
    assert COMM_TERMS == ("forward_gathers_s", "backward_reduce_scatters_s", "step_all_reduce_s")
    assert e["label"] == "predicted" and e["seconds"] == [round(c, 3) for c in comm] and comm[0] > 0
    assert e["share"] == sorted(round(c / s, 4) for c, s in zip(comm, p["step_s"])) and 0 < e["share"][0] <= e["share"][1] < 1
    assert e["by_phase"] == {name: list(p["terms"][name]) for name in COMM_TERMS}


def _gemm_flops(trace: dict) -> int:
    return sum(2 * m * n * k * count for m, n, k, count in trace["gemms"])


@pytest.mark.parametrize("kind, micro_batch_size", [("chat", 1), ("chat", 2), ("synthetic", 1)])
def test_a_published_checkpointed_trace_holds_exactly_the_layers_recomputed_forward(kind, micro_batch_size):
    """Oracle for what the job's checkpointing recomputes. transformers 5.13.0
    ``modeling_layers.py`` ``GradientCheckpointingLayer.__call__`` checkpoints a decoder layer
    only ``if self.gradient_checkpointing and self.training`` (the loop trains in train mode and
    evaluation restores it), through torch's non-reentrant checkpoint
    (``use_reentrant=False``, training/parallel.py ``checkpoint_activations``), which stops
    recomputing once every tensor the layer saved for backward is back (torch 2.13.0
    ``torch/utils/checkpoint.py``:1128-1131, ``early_stop`` True by default). The layer's last
    saved tensor is ``down_proj``'s input, so the recompute runs q, k, v, o, gate and up
    (2 x tokens x in x out FLOPs each) and the attention, never ``down_proj``; the model FLOPs
    (the MFU's numerator) do not change."""
    from raytrain_eks.planning.step_model import find_trace, load_traces

    s, tokens = QWEN2_5_1_5B, 2048 * micro_batch_size
    kv = s.num_kv_heads * (s.head_dim or s.hidden_size // s.num_heads)
    layer_forward = 2 * tokens * (s.hidden_size * (2 * s.hidden_size + 2 * kv) + 2 * s.hidden_size * s.intermediate_size)
    key = dict(model="Qwen2.5-1.5B", kind=kind, seq_len=2048, micro_batch_size=micro_batch_size)
    plain, checkpointed = (find_trace(load_traces(), **key, activation_checkpointing=ac) for ac in (False, True))
    assert _gemm_flops(checkpointed) - _gemm_flops(plain) == s.num_layers * layer_forward
    assert checkpointed["attention_flops"] > plain["attention_flops"]
    assert checkpointed["model_flops"] == plain["model_flops"]



def test_a_calibration_without_a_measured_step_still_says_the_rates_were_calibrated(tmp_path):
    """bench/gpu_check.py writes ``"step": null`` when its profile run fails, with the GEMM rates
    and memory bandwidth measured all the same: the prediction handed to the run (run.json
    ``exposed_comm``) and the report's "step time, predicted" row say it was calibrated."""
    import json

    from raytrain_eks.planning.gpu_figures import figures_for
    from raytrain_eks.runs.report import predicted_step_text

    path = tmp_path / "gpu_calibration.json"
    path.write_text(json.dumps({"gpu": "L4", "measured_at": "2026-12-03", "memory_gbytes_per_s": 251.0, "step": None,
                                "gemm": [{"m": 2048, "n": 2048, "k": 2048, "tflops": 60.0}]}))
    f = figures_for("L4", 40, path)
    handed = exposed_comm(predict(TRACE, _measured(), Cluster(), QWEN2_5_1_5B, f))
    assert handed["calibrated"] is True and handed["assumed"] == ["kernel_floor_us", "pcie", "efa"]
    assert predicted_step_text(handed).endswith("assumed: kernel_floor_us, pcie, efa; calibrated by make gpu-check)")
    published_only = exposed_comm(predict(TRACE, _measured(), Cluster(), QWEN2_5_1_5B, figures_for("L4", 40, tmp_path / "none")))
    assert published_only["calibrated"] is False
