"""MFU of one GPU at Qwen2.5-1.5B shapes: random init, packed chat blocks, the job's code.

Same code path as the job: packed-document attention (training/model.py), the target-only
chunked loss on the host batch (training.model.loss_sum), training.parallel.parallelize (FSDP2
on a 1-rank NCCL mesh, bf16 compute, optional activation checkpointing and compile), fused
AdamW; FLOPs from training/flops.py (the model's real shapes), peak from its bf16 table. To fit
ONE 24 GB GPU the weights, gradients and AdamW state are bf16 (12.4 GB for 1.5B; the job's fp32
master copy is sharded over 4-8 GPUs): the step's compute, what MFU measures, is the same.
Without a GPU it prints ``{"name": "gpu_mfu", "skipped": "no GPU", ...}`` and exits 0.
Prints ONE JSON object on its last line. Run: ``python bench/bench_gpu_mfu.py [--seq 4096]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from environment.instances import peak_bf16_tflops  # noqa: E402

from raytrain_eks.planning.measured_plan import MODEL_CONFIGS  # noqa: E402
from training.contract import PEAK_MEMORY_GIB  # noqa: E402  (the key the job's own rows use)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-activation-checkpointing", action="store_true")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"name": "gpu_mfu", "skipped": "no GPU", "device": "cpu", "seq_len": args.seq}))
        return

    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, Qwen2Config

    from bench_full_size_plan import packed_chat_batch
    from training import flops
    from training.model import count_targets, loss_sum, use_packed_attention
    from training.optim import adamw_kernel
    from training.parallel import build_mesh, parallelize

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    config = Qwen2Config(**MODEL_CONFIGS["Qwen2.5-1.5B"])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.config.use_cache = False
    use_packed_attention(model)
    parallelize(model, build_mesh("full_shard", 1, on_gpu=True), strategy="full_shard", on_gpu=True,
                activation_checkpointing=not args.no_activation_checkpointing, compile=args.compile)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, **adamw_kernel(model))
    batch = packed_chat_batch(args.micro_batch, args.seq)  # host tensors, as the loop hands them over
    targets = count_targets(batch["labels"])
    device = torch.device("cuda", 0)
    times = []
    for _ in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        (loss_sum(model, batch, device) / targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times[args.warmup:])
    tokens_per_s = args.micro_batch * args.seq / step_s
    shapes = flops.ModelShapes.from_hf_config(config)
    per_token = flops.training_flops_per_token(shapes, args.seq)
    name = torch.cuda.get_device_name()
    peak = peak_bf16_tflops(name)
    mfu = flops.mfu(tokens_per_s, per_token, peak)
    print(json.dumps({
        "name": "gpu_mfu", "device": name, "peak_bf16_tflops": peak, "seq_len": args.seq,
        "micro_batch": args.micro_batch, "activation_checkpointing": not args.no_activation_checkpointing,
        "compile": args.compile, "params": shapes.num_params(), "steps_measured": args.steps,
        "step_s": round(step_s, 4), "tokens_per_s": round(tokens_per_s, 1),
        "tflops": round(flops.achieved_tflops(tokens_per_s, per_token), 2),
        "mfu": round(mfu, 4) if mfu is not None else None,
        PEAK_MEMORY_GIB: round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2),
        "torch": torch.__version__,
    }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
