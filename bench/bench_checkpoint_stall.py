"""How long a checkpoint holds the training loop: async DCP save vs a synchronous save.

One process, CPU, a small Qwen2 (about 20 M parameters; fp32 weights + AdamW state ~ 250 MB on
disk per checkpoint). The loop trains and checkpoints every ``EVERY`` steps three ways:
- ``async``: what the job does (``CheckpointManager``, async DCP + background hash/marker; the
  upload is Ray's ASYNC mode, not part of the loop, so the report here is a no-op);
- ``sync``: the same state with ``dcp.save`` + hashing + marker in the loop thread;
- ``sync_with_copy``: ``sync`` plus a synchronous copy of the folder to a "storage" directory
  (what Ray's default SYNC upload costs the loop, with a local disk instead of S3).
Figures: mean stall per checkpoint (s), mean step time without checkpoint (s), bytes written.
Prints ONE JSON object on the last line. Timings are noisy on shared machines: never asserted.
"""
from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS, EVERY = 12, 2


def build():
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = dict(model_type="qwen2", vocab_size=8192, hidden_size=384, intermediate_size=1024,
                  num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=2,
                  max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1,
                  eos_token_id=1)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4), config


class Stream:
    def __init__(self):
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def run(mode: str, scratch: Path) -> dict:
    from training.checkpointing import CheckpointManager, TrainerState, copy_report

    model, optimizer, config = build()
    trainer = TrainerState(data=Stream())
    report = copy_report(str(scratch / "storage")) if mode == "sync_with_copy" else (lambda m, f, d: None)
    manager = CheckpointManager(model=model, optimizer=optimizer, trainer=trainer, local_root=str(scratch / mode),
                                run_name="bench", every_n_steps=EVERY, report=report,
                                async_save=(mode == "async"), model_config=config)
    step_times = []
    for step in range(1, STEPS + 1):
        began = time.perf_counter()
        ids = torch.randint(2, 8192, (4, 128))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        trainer.step = step
        trainer.data.position += 1
        if step % EVERY:
            step_times.append(time.perf_counter() - began)
        manager.step_end(step, {}, max_steps=STEPS)
    manager.finish(STEPS, {})
    folder = scratch / mode / "bench" / f"checkpoint_{EVERY:08d}"
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    periodic = [t for t in manager.timings if t.step != STEPS]  # the final one waits by design
    final = [t for t in manager.timings if t.step == STEPS]
    return {"stall_s": round(statistics.mean(t.stall_s for t in periodic), 3),
            "final_stall_s": round(final[0].stall_s, 3) if final else None,
            "write_s": round(statistics.mean(t.write_s for t in periodic), 3),
            "step_s": round(statistics.mean(step_times), 3), "checkpoints": len(periodic), "bytes": size}


def main() -> None:
    scratch = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    try:
        figures = {mode: run(mode, scratch) for mode in ("async", "sync", "sync_with_copy")}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    a, s = figures["async"], figures["sync"]
    print(json.dumps({
        "name": "checkpoint_stall",
        "checkpoint_mb": round(s["bytes"] / 1e6, 1),
        "async_stall_s": a["stall_s"], "sync_stall_s": s["stall_s"],
        "sync_with_copy_stall_s": figures["sync_with_copy"]["stall_s"],
        "async_write_s": a["write_s"], "async_final_stall_s": a["final_stall_s"],
        "step_s_async": a["step_s"], "step_s_sync": s["step_s"],  # background writes share 2 cores
        "stall_ratio_async_vs_sync": round(a["stall_s"] / s["stall_s"], 3) if s["stall_s"] else None,
        "note": "1 process, CPU; mean over the periodic checkpoints (the final one waits by design); "
                "the upload is Ray's ASYNC mode, outside the loop",
    }))


if __name__ == "__main__":
    main()
