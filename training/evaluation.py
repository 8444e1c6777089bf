"""Held-out evaluation: loss and perplexity before training (step 0), every N steps, at the end.

Every rank evaluates its own shard of the held-out batches; sums and token counts are
all-reduced, so the figure is the token-weighted mean over all ranks' batches. All ranks run the
SAME number of batches (the minimum over ranks): FSDP's gathers are collectives, and a rank with
one batch more would wait forever.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import torch
import torch.distributed as dist



@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Iterable[dict[str, torch.Tensor]], *,
             device: torch.device, max_batches: int, step: int, objective: Any = None) -> dict[str, Any] | None:
    """Held-out loss and perplexity over at most ``max_batches`` batches per rank, under the
    run's objective (training/objectives/; None: ``sft``): DPO's held-out figures are its loss
    and its rewards (``eval_rewards_accuracy``...); its "perplexity" is exp of the DPO loss,
    kept for the shape of the record only.

    Returns None when no rank has a held-out batch (the run record then says so).
    """
    from training.objectives import sft

    objective = objective or sft.SFT()
    local = []
    for batch in batches:
        if len(local) >= max_batches:
            break
        local.append(batch)
    count = torch.tensor([len(local)], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MIN)
    n_batches = int(count.item())
    if n_batches == 0:
        return None
    was_training = model.training
    model.eval()
    totals = torch.zeros(2 + len(objective.extra), dtype=torch.float64, device=device)  # loss sum, units, extra
    for batch in local[:n_batches]:
        # the host batch, as training/loop.py passes it: indices and layout computed on the host, then moved
        loss, extra = objective.loss(model, batch, device)
        totals[0] += loss.double()
        totals[1] += objective.units(batch)
        totals[2:] += extra
    dist.all_reduce(totals)
    model.train(was_training)
    figures = objective.figures(totals.tolist(), prefix="eval_")
    loss = figures["eval_loss"]
    return {"kind": "eval", "step": step, **figures,
            "eval_perplexity": math.exp(loss) if loss < 50 else float("inf"),
            "eval_tokens": int(totals[1]), "eval_batches_per_rank": n_batches}


def before_after(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """The figures every run ends with: held-out loss and perplexity before and after."""
    if before is None or after is None:
        return {"eval_loss_before": None, "eval_loss_after": None,
                "eval_perplexity_before": None, "eval_perplexity_after": None, "eval_improved": None}
    return {"eval_loss_before": before["eval_loss"], "eval_loss_after": after["eval_loss"],
            "eval_perplexity_before": before["eval_perplexity"],
            "eval_perplexity_after": after["eval_perplexity"],
            "eval_improved": after["eval_loss"] < before["eval_loss"]}


def eval_line(figures: dict[str, Any], *, stopped: bool = False) -> str:
    """``eval: loss 5.1234 -> 3.2100 | ppl 168.0 -> 24.8``; a stopped run skipped the final one."""
    if stopped:
        return "eval: skipped (stopped before max_steps: the grace period is for the checkpoint)"
    if figures["eval_loss_before"] is None:
        return "eval: no held-out data"
    return (f"eval: loss {figures['eval_loss_before']:.4f} -> {figures['eval_loss_after']:.4f} | "
            f"ppl {figures['eval_perplexity_before']:.1f} -> {figures['eval_perplexity_after']:.1f}")


@torch.no_grad()
def exact_match(model: torch.nn.Module, prompts: list[Any], *, device: torch.device, stop_ids: set[int],
                decode: Any, max_new_tokens: int = 32, max_prompts: int = 8) -> dict[str, Any] | None:
    """Greedy generation on held-out chat prompts; the share whose answer matches exactly.

    ``prompts`` hold ``prompt_ids`` and ``answer`` (the same list on every rank). Every rank runs
    the same forwards (FSDP gathers are collectives); rank 0's next token is broadcast so the
    ranks can never disagree on when to stop. No KV cache: short answers, simple code.
    """
    prompts = prompts[:max_prompts]
    if not prompts:
        return None
    was_training = model.training
    model.eval()
    hits, samples = 0, []
    for prompt in prompts:
        ids = torch.tensor([list(prompt.prompt_ids)], dtype=torch.long, device=device)
        generated: list[int] = []
        for _ in range(max_new_tokens):
            token = model(input_ids=ids).logits[:, -1, :].argmax(dim=-1)
            dist.broadcast(token, src=0)
            if int(token.item()) in stop_ids:
                break
            generated.append(int(token.item()))
            ids = torch.cat([ids, token.view(1, 1)], dim=1)
        text = decode(generated).strip()
        hits += text == prompt.answer.strip()
        if len(samples) < 3:
            samples.append({"answer": prompt.answer, "generated": text})
    model.train(was_training)
    return {"exact_match": hits / len(prompts), "exact_match_prompts": len(prompts), "exact_match_samples": samples}
