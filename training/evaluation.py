"""Held-out evaluation: loss and perplexity before training (step 0), every N steps, at the end;
and benchmark tasks (multiple choice by log-likelihood, generative exact match) before and after
training, or on demand on any saved model (``python -m training.evaluation MODEL --tasks ...``).

Every rank evaluates its own shard of the held-out batches; sums and token counts are
all-reduced, so the figure is the token-weighted mean over all ranks' batches. All ranks run the
SAME number of batches (the minimum over ranks): FSDP's gathers are collectives, and a rank with
one batch more would wait forever.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
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
    from training import model as forward_fns
    from training.objectives import sft

    objective = objective or sft.SFT(forward_fns)
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


# --- benchmark tasks -----------------------------------------------------------------------------
# Multiple choice by log-likelihood and generative exact match, scored the way
# lm-evaluation-harness 0.4.13 scores them (tests/training/test_benchmark_lm_eval.py runs lm_eval
# itself on the same model and task): the prompt "Question: {question}\nAnswer:" (its ARC and
# SciQ templates), each choice continued after one space (``target_delimiter``); a choice's
# log-likelihood is the sum over its tokens, tokenized as HFLM ``_encode_pair`` does (the
# context's trailing spaces moved to the continuation, the continuation = tokens of context +
# continuation past those of the context alone); ``acc`` = the highest log-likelihood is the
# answer, ``acc_norm`` = the highest per character of the choice (api/task.py
# ``ConfigurableTask.process_results``, ``completion_len = len(choice)``); ``exact_match`` = the
# greedy continuation up to the first newline, stripped, equals the answer.

BENCHMARK_PROMPT = "Question: {question}\nAnswer:"
TARGET_DELIMITER = " "
GENERATION_STOP = "\n"


@dataclass(frozen=True, slots=True)
class Question:
    question: str
    answer: int | str
    """Multiple choice: the index of the right choice; generation: the expected text."""
    choices: tuple[str, ...] = ()


def read_task(entry: str) -> tuple[str, list[Question]]:
    """``(task name, questions)`` of one ``eval.benchmarks`` entry; one-line errors name the
    file, the line and the field."""
    import json

    from training.config_checks import benchmark_task

    name, path = benchmark_task(entry)
    questions = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not valid JSON ({err.msg})") from None
        question, choices, answer = record.get("question"), record.get("choices"), record.get("answer")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: field 'question' must be a non-empty string, got {question!r}")
        if choices is None:
            if not isinstance(answer, str) or not answer.strip():
                raise ValueError(f"{where}: field 'answer' must be the expected text (no 'choices': generation), "
                                 f"got {answer!r}")
            questions.append(Question(question, answer))
            continue
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
            raise ValueError(f"{where}: field 'choices' must be a list of at least 2 non-empty strings, got {choices!r}")
        if isinstance(answer, str) and answer in choices:
            answer = choices.index(answer)
        if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
            raise ValueError(f"{where}: field 'answer' must be a choice's index (0..{len(choices) - 1}) or its text, "
                             f"got {answer!r}")
        questions.append(Question(question, answer, tuple(choices)))
    if not questions:
        raise ValueError(f"{path}: no questions")
    return name, questions


def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval 0.4.13 ``lm_eval/api/model.py`` ``TemplateLM._encode_pair``: (context ids,
    continuation ids), each text encoded with the tokenizer's own special-token rule (HFLM
    ``tok_encode`` with ``add_bos_token`` unset: ``tokenizer.encode(text)``)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    encode = lambda text: list(tokenizer(text)["input_ids"])  # noqa: E731
    whole, head = encode(context + continuation), encode(context)
    return head, whole[len(head):]


def _choice_batch(tokenizer: Any, q: Question) -> dict[str, torch.Tensor]:
    """One row: every choice's context + continuation, each its own document (positions restart),
    the continuation tokens the targets."""
    ids, labels, positions = [], [], []
    for choice in q.choices:
        context, continuation = encode_pair(tokenizer, BENCHMARK_PROMPT.format(question=q.question),
                                            TARGET_DELIMITER + choice)
        ids += context + continuation
        labels += [-100] * len(context) + continuation
        positions += list(range(len(context) + len(continuation)))
    as_row = lambda values: torch.tensor([values], dtype=torch.long)  # noqa: E731
    return {"input_ids": as_row(ids), "labels": as_row(labels), "position_ids": as_row(positions)}


def choice_loglikelihoods(model: torch.nn.Module, tokenizer: Any, q: Question, device: torch.device) -> list[float]:
    """Each choice's summed log-likelihood, in one forward (the choices packed in one row)."""
    from training.model import document_segments, token_losses

    batch = _choice_batch(tokenizer, q)
    segment, count = document_segments(batch)
    losses = token_losses(model, batch, device)
    sums = torch.zeros(count, dtype=torch.float64, device=losses.device).index_add(
        0, segment.to(losses.device), -losses.double())
    return sums.tolist()


def score_choices(lls: list[float], q: Question) -> tuple[float, float]:
    """(acc, acc_norm) of one question (lm-eval api/task.py ``process_results``, multiple_choice)."""
    import numpy as np

    pred = int(np.argmax(lls))
    pred_norm = int(np.argmax(np.array(lls) / np.array([float(len(c)) for c in q.choices])))
    return float(pred == q.answer), float(pred_norm == q.answer)


def _generate(model: torch.nn.Module, tokenizer: Any, q: Question | None, device: torch.device, *,
              max_new_tokens: int, stop_ids: set[int]) -> str:
    """Greedy continuation of one question's prompt. Every rank steps together (FSDP's gathers
    are collectives): a rank without a question (``q`` None) or already stopped feeds its last
    ids again until every rank has stopped."""
    prompt = BENCHMARK_PROMPT.format(question=q.question if q else "")
    ids = torch.tensor([encode_pair(tokenizer, prompt, "")[0]], dtype=torch.long, device=device)
    generated: list[int] = []
    done = q is None
    for _ in range(max_new_tokens):
        flag = torch.tensor([0.0 if done else 1.0], device=device)
        dist.all_reduce(flag)
        if flag.item() == 0:
            break
        token = int(model(input_ids=ids).logits[0, -1].argmax())
        if done:
            continue
        if token in stop_ids or GENERATION_STOP in tokenizer.decode(generated + [token]):
            done = True
            continue
        generated.append(token)
        ids = torch.cat([ids, torch.tensor([[token]], device=device)], dim=1)
    return tokenizer.decode(generated).split(GENERATION_STOP)[0].strip()


@torch.no_grad()
def benchmark(model: torch.nn.Module, tokenizer: Any, entries: Iterable[str], *, device: torch.device, rank: int = 0,
              world_size: int = 1, max_questions: int = 0, stop_ids: Iterable[int] = (), step: int = 0,
              max_new_tokens: int = 16) -> dict[str, Any]:
    """Each task's scores, sharded over the ranks: rank r takes questions r, r + world, ...; the
    hits are all-reduced. Every rank runs the same number of forwards (a rank out of questions
    repeats one and drops its result). Returns ``{"kind": "benchmark", "step", "tasks": {task:
    {metric: share, "questions": n}}}``."""
    was_training = model.training
    model.eval()
    tasks: dict[str, dict[str, Any]] = {}
    for entry in entries:
        name, questions = read_task(entry)
        questions = questions[:max_questions] if max_questions else questions
        mine = questions[rank::world_size]
        slots = -(-len(questions) // world_size)
        multiple_choice = bool(questions[0].choices)
        hits = torch.zeros(3, dtype=torch.float64, device=device)  # acc (or exact_match), acc_norm, questions
        for slot in range(slots):
            q = mine[slot] if slot < len(mine) else None
            if multiple_choice:
                lls = choice_loglikelihoods(model, tokenizer, q or questions[0], device)
                if q is not None:
                    acc, acc_norm = score_choices(lls, q)
                    hits += torch.tensor([acc, acc_norm, 1.0], dtype=torch.float64, device=device)
            else:
                text = _generate(model, tokenizer, q, device, max_new_tokens=max_new_tokens, stop_ids=set(stop_ids))
                if q is not None:
                    hits += torch.tensor([float(text == str(q.answer).strip()), 0.0, 1.0], dtype=torch.float64,
                                         device=device)
        dist.all_reduce(hits)
        n = max(hits[2].item(), 1.0)
        tasks[name] = ({"acc": hits[0].item() / n, "acc_norm": hits[1].item() / n} if multiple_choice
                       else {"exact_match": hits[0].item() / n})
        tasks[name]["questions"] = int(hits[2].item())
    model.train(was_training)
    return {"kind": "benchmark", "step": step, "tasks": tasks}


def benchmark_row(result: dict[str, Any]) -> dict[str, Any]:
    """The metrics.jsonl row: ``benchmark/<task>.<metric>`` as flat numbers (every sink's scalars)."""
    row = {"kind": "benchmark", "step": result["step"]}
    for task, scores in result["tasks"].items():
        row.update({f"{task}.{metric}": value for metric, value in scores.items()})
    return row


def benchmark_line(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """``benchmarks: tiny-arith acc 0.250 -> 0.400, acc_norm ...``; empty without benchmarks."""
    if not after:
        return ""
    parts = []
    for task, scores in after["tasks"].items():
        old = ((before or {}).get("tasks") or {}).get(task, {})
        figures = ", ".join(f"{m} {old.get(m, float('nan')):.3f} -> {v:.3f}" for m, v in scores.items() if m != "questions")
        parts.append(f"{task} {figures}")
    return "benchmarks: " + " | ".join(parts)


def evaluate_export(argv: list[str] | None = None) -> int:
    """``python -m training.evaluation MODEL --tasks TASK [--tasks ...]``: score a saved model
    (any run's Hugging Face export, a local folder or ``s3://``) on benchmark tasks, one process.
    Prints the scores as JSON."""
    import argparse
    import json
    import os
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m training.evaluation", description=evaluate_export.__doc__)
    parser.add_argument("model", help="a Hugging Face model folder or s3:// prefix (e.g. a run's export)")
    parser.add_argument("--tasks", action="append", required=True, help="a shipped task's name or a .jsonl file")
    parser.add_argument("--tokenizer", default="", help="tokenizer folder (default: the model's own)")
    parser.add_argument("--max-questions", type=int, default=0)
    args = parser.parse_args(argv)
    for entry in args.tasks:
        read_task(entry)  # bad input: one line, before the model loads
    from transformers import AutoModelForCausalLM

    from training.model import resolve_model_path, use_packed_attention
    from training.data.tokenizer import load_tokenizer

    path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(args.tokenizer or path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    use_packed_attention(model)
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1,
                                init_method=f"file://{os.path.join(tempfile.mkdtemp(), 'pg')}")
    stop = {tokenizer.eos_token_id} - {None}
    print(json.dumps(benchmark(model, tokenizer, args.tasks, device=torch.device("cpu"), stop_ids=stop,
                               max_questions=args.max_questions), indent=1))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(evaluate_export())
