"""Host overhead: the share of wall time spent outside the optimizer steps, and the cost of the
host-device syncs the loop now makes only at log steps.

A real Ray Train run (2 CPU workers, tiny Qwen2, synthetic data) through ``training.launch``'s
TorchTrainer, with the job's metric reporting on (``ray.train.report`` every
``report_every_n_steps`` at Ray's DEFAULT controller poll interval, metrics.jsonl, the progress
line). The loop books every second outside the steps (report, metrics upload, evaluation,
checkpoint) as ``overhead_s`` of its log window (training/loop.py): overhead % = sum of
overhead_s / sum of window_s over the steady windows (the first, warm-up, excluded). Prints ONE
JSON object on its last line. Run: ``.venv/bin/python bench/bench_host_overhead.py``.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS, REPORT_EVERY = 40, 10


def main() -> None:
    import ray

    from training.config import job_config_from_dict
    from training.launch import build_trainer, run_dir

    with tempfile.TemporaryDirectory() as storage:
        job = job_config_from_dict({
            "name": "bench-host-overhead",
            "model": {"config": dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                     pad_token_id=2047, bos_token_id=2047, eos_token_id=2047)},
            "data": {"kind": "synthetic"},
            "train": {"seq_len": 256, "micro_batch_size": 2, "global_batch_size": 4, "max_steps": STEPS,
                      "warmup_steps": 2, "log_every_n_steps": 1, "report_every_n_steps": REPORT_EVERY},
            "parallel": {"num_workers": 2, "workers_per_node": 2},
            "checkpoint": {"storage_path": storage, "every_n_steps": 0, "export_hf": False},
            "eval": {"max_batches": 1},
        }, "bench")
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
        try:
            build_trainer(job).fit()
        finally:
            ray.shutdown()
        lines = Path(run_dir(job), "metrics.jsonl").read_text().splitlines()
    windows = [r for r in map(json.loads, lines) if r["kind"] == "train" and "window_s" in r][1:]
    overhead = [r["overhead_s"] / r["window_s"] for r in windows]
    after_report = [r["overhead_s"] / r["window_s"] for r in windows if (r["step"] - 1) % REPORT_EVERY == 0]
    print(json.dumps({
        "name": "host_overhead", "device": "cpu", "workers": 2, "windows_measured": len(windows),
        "report_every_n_steps": REPORT_EVERY,
        "health_check_interval_s": float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "2")),
        "median_step_s": round(statistics.median(r["step_time_s"] for r in windows), 4),
        "median_compute_s": round(statistics.median(r["compute_s"] for r in windows), 4),
        "host_overhead_pct": round(100 * sum(r["overhead_s"] for r in windows) / sum(r["window_s"] for r in windows), 2),
        "host_overhead_median_pct": round(100 * statistics.median(overhead), 2),
        "host_overhead_after_report_steps_pct": round(100 * statistics.mean(after_report), 2) if after_report else None,
        "load_average_1m": round(os.getloadavg()[0], 1),
    }))


if __name__ == "__main__":
    main()
