"""What periodic checkpoints cost the run: wall time of N steps with checkpoints vs without.

The real loop (``training.loop.train``, one process, CPU, a small Qwen2, synthetic data) runs
``STEPS`` steps three times:
- ``none``: no checkpoints; the loop's metric reports every ``REPORT_EVERY`` steps;
- ``checkpoints``: a checkpoint every ``EVERY`` steps (and the final one), the loop's real
  report pattern, uploads to a SLOW storage (a local folder written at ``UPLOAD_MB_S``);
- optionally the same against another tree (``--tree OLD``, e.g. a checkout of the commit
  before the fix) to see what the old pattern cost.

Ray Train v2's reporting is modelled as it works (``train/v2/_internal/execution/context.py``):
an ASYNC checkpoint report starts the upload on a thread and returns; reports reach the
controller strictly in order, so a metrics-only report waits until every earlier upload has
finished. ``ratio`` = median wall(checkpoints) / median wall(none) over ``--repeats`` alternating runs
(after one warm-up run): the goal is <= 1.05. The final checkpoint
is included (the run is not over before it is written; its upload happens after the loop).
Prints ONE JSON object on its last line. Timings are noisy on shared machines: never asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

STEPS, EVERY, REPORT_EVERY, UPLOAD_MB_S = 40, 10, 5, 20.0
MODEL = dict(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, pad_token_id=8191, bos_token_id=8191,
             eos_token_id=8191)


class RayLikeReporting:
    """Ray Train v2's ordered reports with ASYNC checkpoint uploads to a slow storage."""

    def __init__(self, storage: Path, mb_per_s: float):
        self.storage, self.rate = storage, mb_per_s * 1e6
        self.lock = threading.Condition()
        self.issued = self.done = 0
        self.blocked_s = 0.0
        self.threads: list[threading.Thread] = []

    def _upload(self, folder: str, name: str, index: int) -> None:
        target = self.storage / name
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                out = target / path.relative_to(folder)
                out.parent.mkdir(parents=True, exist_ok=True)
                began = time.perf_counter()
                shutil.copyfile(path, out)
                time.sleep(max(0.0, path.stat().st_size / self.rate - (time.perf_counter() - began)))
        shutil.rmtree(folder, ignore_errors=True)  # delete_local_checkpoint_after_upload
        with self.lock:
            self.lock.wait_for(lambda: self.done == index - 1)  # the report's turn
            self.done = index
            self.lock.notify_all()

    def checkpoint_report(self, metrics: dict, folder: str, name: str) -> None:
        with self.lock:
            self.issued += 1
            index = self.issued
        thread = threading.Thread(target=self._upload, args=(folder, name, index), daemon=True)
        thread.start()
        self.threads.append(thread)

    def report(self, metrics: dict) -> None:
        began = time.perf_counter()
        with self.lock:
            self.issued += 1
            index = self.issued
            self.lock.wait_for(lambda: self.done == index - 1)
            self.done = index
            self.lock.notify_all()
        self.blocked_s += time.perf_counter() - began

    def uploads_in_flight(self) -> int:
        with self.lock:
            return self.issued - self.done

    def drain(self) -> None:
        for thread in self.threads:
            thread.join()


def run(mode: str, scratch: Path) -> dict:
    import torch.distributed as dist

    from training.config import job_config_from_dict
    from training.loop import local_context, train

    storage = scratch / mode / "storage"
    job = job_config_from_dict({
        "name": "bench-ckpt", "model": {"config": MODEL}, "data": {"kind": "synthetic"},
        "train": {"seq_len": 128, "micro_batch_size": 4, "global_batch_size": 4, "max_steps": STEPS,
                  "warmup_steps": 2, "log_every_n_steps": REPORT_EVERY, "report_every_n_steps": REPORT_EVERY},
        "checkpoint": {"storage_path": str(storage) if mode != "none" else "", "every_n_steps": EVERY,
                       "export_hf": False},
        "eval": {"max_batches": 1, "every_n_steps": 0},
    }, "bench")
    reporting = RayLikeReporting(storage, UPLOAD_MB_S)
    (scratch / mode).mkdir(parents=True, exist_ok=True)
    ctx = local_context(str(scratch / mode))
    ctx.report, ctx.checkpoint_report = reporting.report, reporting.checkpoint_report
    if hasattr(ctx, "uploads_in_flight"):
        ctx.uploads_in_flight = reporting.uploads_in_flight
    began = time.perf_counter()
    try:
        train(job, ctx)
    finally:
        dist.destroy_process_group()
    wall = time.perf_counter() - began
    reporting.drain()
    uploaded = sorted(p.name for p in storage.glob("checkpoint_*")) if storage.exists() else []
    size = sum(p.stat().st_size for p in storage.rglob("*") if p.is_file()) / max(1, len(uploaded))
    return {"wall_s": round(wall, 2), "report_blocked_s": round(reporting.blocked_s, 2),
            "checkpoints_uploaded": len(uploaded), "checkpoint_mb": round(size / 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]),
                        help="repository tree whose training package runs (default: this one)")
    parser.add_argument("--modes", default="none,checkpoints")
    parser.add_argument("--repeats", type=int, default=3,
                        help="alternate the modes this many times and take each one's median (shared machines)")
    args = parser.parse_args()
    sys.path.insert(0, args.tree)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    scratch = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    try:
        modes = args.modes.split(",")
        runs: dict[str, list[dict]] = {mode: [] for mode in modes}
        run(modes[0], scratch / "warm-up")  # imports, allocator and page cache: not part of either figure
        for repeat in range(args.repeats):
            for mode in modes:
                runs[mode].append(run(mode, scratch / f"r{repeat}"))
        figures = {mode: {**sorted(rs, key=lambda r: r["wall_s"])[len(rs) // 2],
                          "wall_s_all": [r["wall_s"] for r in rs]} for mode, rs in runs.items()}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = {"name": "checkpoint_stall", "tree": args.tree, "repeats": args.repeats, "steps": STEPS, "every_n_steps": EVERY,
           "report_every_n_steps": REPORT_EVERY, "upload_mb_s": UPLOAD_MB_S, **figures}
    if "none" in figures and "checkpoints" in figures:
        out["ratio"] = round(figures["checkpoints"]["wall_s"] / figures["none"]["wall_s"], 3)
    out["load_average_1m"] = round(os.getloadavg()[0], 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
