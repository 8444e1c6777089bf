"""The branches that matter on GPUs and on EKS, on CPU with only the device call injected:
the transport refusal ends the run once (no Ray retry), no checkpoint report waits behind an
upload, and the throughput figures count the time outside the steps."""
from __future__ import annotations

import json
import time

import pytest
import torch
import torch.distributed as dist

from tiny_qwen import tiny_qwen2_config
from training import contract
from training.config import job_config_from_dict


def _job(tmp_path, **sections):
    base = {"name": "gpu-paths", "model": {"config": tiny_qwen2_config()}, "data": {"kind": "synthetic"},
            "train": {"seq_len": 16, "micro_batch_size": 1, "global_batch_size": 1, "max_steps": 4, "lr": 1e-3,
                      "warmup_steps": 1, "log_every_n_steps": 2},
            "eval": {"max_batches": 1}}
    return job_config_from_dict({**base, **sections}, "test")


def test_a_refused_transport_ends_the_run_once_without_an_exception(tmp_path):
    from training.launch import outcome
    from training.loop import local_context, train

    job = _job(tmp_path, evidence={"require_transport": "efa"})
    try:
        summary = train(job, local_context(str(tmp_path)))
    finally:
        dist.destroy_process_group()
    # the workers return (Ray counts no failure, so no retry) and say why, in one line
    reason = summary[contract.REFUSED]
    assert summary["steps"] == 0 and "\n" not in reason and "require_transport = 'efa'" in reason
    rows = [json.loads(line) for line in (tmp_path / contract.METRICS_NAME).read_text().splitlines()]
    assert rows[-1][contract.REFUSED] == reason
    # the driver turns that row into a failed run with this one line
    assert outcome(rows[-1]) == ("failed", reason, 1)
    assert outcome({"stopped_by_signal": True})[2] == 143 and outcome({})[0] == "succeeded"


class _SlowUploads:
    """Ray Train's ASYNC uploads as a worker sees them: one upload thread, FIFO; each upload
    takes ``steps`` training steps."""

    def __init__(self, steps: int):
        self.steps, self.queue, self.reports, self.queued_at_report = steps, [], [], []

    def report(self, metrics, folder, name):
        self.queued_at_report.append(len(self.queue))
        self.reports.append(name)
        self.queue.append(self.steps)

    def in_flight(self) -> int:
        return len(self.queue)

    def tick(self) -> None:
        if self.queue:
            self.queue[0] -= 1
            if self.queue[0] <= 0:
                self.queue.pop(0)


def test_a_slow_storage_skips_checkpoints_instead_of_queueing_without_bound(tmp_path):
    from training.checkpointing import CheckpointManager, TrainerState
    from training.checkpointing.manager import MAX_QUEUED_UPLOADS

    uploads = _SlowUploads(steps=5)
    manager = CheckpointManager(model=torch.nn.Linear(4, 4), optimizer=None, trainer=TrainerState(),
                                local_root=str(tmp_path), run_name="r", every_n_steps=2, report=uploads.report,
                                uploads_in_flight=uploads.in_flight)
    for step in range(1, 21):
        manager.trainer.step = step
        manager.step_end(step, {"loss": 1.0}, max_steps=20)
        while manager._pending is not None and not manager._pending.future.done():
            time.sleep(0.01)  # the background write (the test is about the uploads)
        uploads.tick()
    manager.finish(20)
    # uploads of 5 steps, a checkpoint due every 2: some are skipped, the queue stays bounded
    # (the final checkpoint always goes), and nothing here ever waited for an upload
    assert manager.skipped_steps and uploads.reports[-1] == "checkpoint_00000020"
    assert max(uploads.queued_at_report[:-1]) < MAX_QUEUED_UPLOADS + 1


def test_the_loop_sends_no_metrics_only_report_while_it_checkpoints(tmp_path):
    from training.loop import local_context, train

    reports, handed = [], []
    job = _job(tmp_path, checkpoint={"storage_path": str(tmp_path / "store"), "every_n_steps": 2, "export_hf": False},
               train={"seq_len": 16, "micro_batch_size": 1, "global_batch_size": 1, "max_steps": 4, "lr": 1e-3,
                      "warmup_steps": 1, "report_every_n_steps": 1})
    ctx = local_context(str(tmp_path))
    ctx.report, ctx.checkpoint_report = reports.append, lambda metrics, folder, name: handed.append(name)
    try:
        train(job, ctx)
    finally:
        dist.destroy_process_group()
    # a metrics-only report after an ASYNC checkpoint report would wait for its upload
    assert reports == [] and handed == ["checkpoint_00000002", "checkpoint_00000004"]
    assert (tmp_path / contract.METRICS_NAME).read_text().count('"kind": "train"') == 4


def test_the_log_window_counts_overhead_in_wall_clock_but_not_in_compute():
    from training.metrics import ThroughputModel
    from training.metrics import LogWindow

    model = ThroughputModel.for_model(tiny_qwen2_config(), seq_len=16, tokens_per_step=1000, world_size=1, device="cpu")
    window = LogWindow(model, on_gpu=False)
    for step in (1, 2):
        time.sleep(0.05)  # "compute"
        window.add({contract.STEP: step}, torch.tensor([6.0, 3.0], dtype=torch.float64), torch.tensor(0.5))
        with window.overhead():
            time.sleep(0.05)  # checkpoint / eval / report
    rows = window.close(peak_memory_gib=1.0)
    first, last = rows
    assert first[contract.LOSS] == pytest.approx(2.0) and first[contract.GRAD_NORM] == pytest.approx(0.5)
    assert contract.TOKENS_PER_S not in first  # figures once per window, on its last row
    assert last[contract.TOKENS_PER_S] < last[contract.COMPUTE_TOKENS_PER_S]
    assert last[contract.WINDOW_S] == pytest.approx(last[contract.OVERHEAD_S] + 2 * last[contract.COMPUTE_S])
    assert last[contract.WINDOW_S] == pytest.approx(2 * last[contract.STEP_TIME_S])
    assert last[contract.TOKENS_PER_S] == pytest.approx(2000 / last[contract.WINDOW_S])  # wall clock


def test_run_wall_clock_figure_is_total_over_total():
    rows = [{contract.TOKENS_PER_S: 10.0, contract.WINDOW_S: 100.0},   # warm-up window, excluded
            {contract.TOKENS_PER_S: 100.0, contract.WINDOW_S: 1.0},
            {contract.TOKENS_PER_S: 10.0, contract.WINDOW_S: 9.0}]     # a checkpoint window
    # (100 x 1 + 10 x 9) tokens over 10 s: the slow window is not hidden as a median would
    assert contract.wall_figure(rows, contract.TOKENS_PER_S) == pytest.approx(19.0)
    assert contract.throughput_summary(rows)[contract.WALL_TOKENS_PER_S] == pytest.approx(19.0)


def test_the_workers_export_the_model_in_its_published_dtype(tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from training.checkpointing import export_local
    from training.loop import local_context, train

    store = tmp_path / "store"
    job = _job(tmp_path, model={"config": tiny_qwen2_config(dtype="bfloat16")},  # published in bf16
               checkpoint={"storage_path": str(store), "every_n_steps": 0, "export_hf": True})
    try:
        summary = train(job, local_context(str(tmp_path), run_dir=str(store / job.run_name)))
    finally:
        dist.destroy_process_group()
    out = summary[contract.EXPORTED]
    assert out == str(store / job.run_name / "hf")
    with safe_open(f"{out}/model.safetensors", "pt") as tensors:
        assert {tensors.get_tensor(k).dtype for k in tensors.keys()} == {torch.bfloat16}
        assert not any("exp_avg" in k for k in tensors.keys())  # the model only
    exported = AutoModelForCausalLM.from_pretrained(out)
    assert exported.dtype == torch.bfloat16
    # the same weights as the final checkpoint (fp32 master copy) cast to bf16
    offline = export_local(store / job.run_name / "checkpoint_00000004", tmp_path / "offline")
    reference = AutoModelForCausalLM.from_pretrained(offline)
    for (name, mine), (_, theirs) in zip(exported.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(mine, theirs), name
