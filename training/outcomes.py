"""How a worker's run ends outside the steps: refused before training (the transport gate) or
exported after it. Both end in the summary row the workers return, never raised: Ray Train
would retry an exception ``max_failures`` times, and a retry changes neither the transport nor
the export. The driver turns the summary into the record's status (:func:`training.verdict.outcome`).
"""
from __future__ import annotations

import os
from typing import Any

import torch

from training import contract, metrics
from training.config import JobConfig


def transport_evidence(job: JobConfig, on_gpu: bool) -> tuple[dict, str | None]:
    """The run's transport evidence and, when the gate refuses it, the one-line reason."""
    from training.nccl_log import NCCL_LOG_DIR
    from training.transport import TransportGate, collect_evidence

    evidence = collect_evidence(require=job.evidence.require_transport, log_dir=NCCL_LOG_DIR if on_gpu else None,
                                num_nodes=job.num_nodes, enforce=False)
    return evidence, TransportGate(require=job.evidence.require_transport).problem(evidence)


def refuse(reason: str, ctx: Any) -> dict[str, Any]:
    """End the run before training, terminally: Ray would retry an exception ``max_failures``
    times and a retry cannot change the transport. The driver reads the reason from the summary
    row and fails the run with this one line."""
    summary = {contract.KIND: contract.KIND_SUMMARY, "steps": 0, contract.REFUSED: reason}
    log = metrics.MetricsLog(ctx.local_dir, enabled=ctx.rank == 0, storage=ctx.storage)
    log.write(summary)
    log.print(f"refused: {reason}")
    log.close()
    return summary


def trained_end_of_turn(job: JobConfig) -> int | None:
    """The end-of-turn token the run's conversations were tokenized with (as
    training/data/tokenize.py reads it: :func:`training.tokenizer.chat_format`), or None when
    the tokenizer has no chat template that closes a turn (synthetic data, plain text models)."""
    if job.data.kind == "synthetic":
        return None
    from training.data.records import DataError
    from training.tokenizer import chat_format, chat_template_problem, load_tokenizer, tokenizer_location

    tokenizer = load_tokenizer(tokenizer_location(job.model))
    if chat_template_problem(tokenizer):
        return None
    try:
        return chat_format(tokenizer).end_of_turn_id
    except DataError:
        return None


def export_on_workers(model: torch.nn.Module, ctx: Any, model_config: dict, job: JobConfig) -> dict[str, Any]:
    """Export on the workers, where the memory and the shards are (every rank gathers; rank 0
    writes ``<run>/hf``). A failed export fails the run's status, not its training: it is
    recorded, not raised (Ray would retry the whole training for it)."""
    from training.checkpointing import export_model
    from training.tokenizer import tokenizer_location

    out_uri = f"{ctx.run_dir.rstrip('/')}/hf" if ctx.run_dir else os.path.join(ctx.local_dir, "hf")
    try:
        end_of_turn = trained_end_of_turn(job)
        written = export_model(model, out_uri, model_config=model_config, tokenizer_dir=tokenizer_location(job.model),
                               scratch=ctx.checkpoint_root, end_of_turn_id=end_of_turn)
    except Exception as err:  # noqa: BLE001 - reported in one line by the driver
        return {contract.EXPORT_ERROR: f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
    return {contract.EXPORTED: out_uri, contract.EXPORTS: written or {}}
