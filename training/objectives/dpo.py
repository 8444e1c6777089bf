"""``dpo``: direct preference optimization (Rafailov et al. 2023) on preference pairs
(``data.kind = "preference"``: ``{"prompt", "chosen", "rejected"}``), as TRL 1.16.0 computes it
(``trl/trainer/dpo_trainer.py`` ``DPOTrainer._compute_loss``; tests/objectives/test_dpo_trl.py
holds this file to it).

For each pair, the policy's and the reference's SUMMED log-probabilities of the chosen and the
rejected completion, on the completion tokens only (the prompt carries no label), then

- ``sigmoid``: ``-logsigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))``;
- ``robust`` (Chowdhury et al. 2024, TRL's ``robust``): ``(-(1 - eps) logsigmoid(beta d) +
  eps logsigmoid(-beta d)) / (1 - 2 eps)`` with ``eps = label_smoothing`` in [0, 0.5).

TRL 1.16's ``sigmoid`` ignores ``label_smoothing`` (the conservative cDPO form moved to its
other losses), so a non-zero value is refused with ``sigmoid`` rather than silently unused.

The loss of a step is the mean over the global batch's pairs (TRL: ``per_sequence_loss.mean()``).
Figures, TRL's names with ``_`` for ``/``: ``rewards_chosen`` / ``rewards_rejected``
(``beta * (pi - ref)``, means), ``rewards_margin`` (their difference), ``rewards_accuracy``
(share of pairs with chosen reward > rejected reward), ``logps_chosen`` / ``logps_rejected``.

A pair's two sequences (prompt + chosen, prompt + rejected) are packed side by side in one row
(training/data/packing.py): the pair is always in one micro batch, and each sequence is its own
document (positions restart, attention stays inside). Which target belongs to which sequence is
read from the host batch: the documents that hold targets, in order, are chosen, rejected,
chosen, rejected...

The reference:

- with LoRA (``[[model.transforms]] name = "lora"``): the same model with its adapters disabled
  (training/model_transforms/lora.py ``adapters_disabled``), no second copy; TRL does the same
  for a new peft adapter;
- a full fine-tune: a frozen copy of the base model, sharded like the policy (FSDP2, no
  gradients, no optimizer state). Built rather than a first pass storing reference log-probs:
  the copy is rebuilt from the same base weights on every (re)start, so a resumed run needs
  nothing stored beside its checkpoint and a step reads no stored table; it costs one more set
  of sharded parameters (no gradients, no AdamW state: about a quarter of the policy's training
  memory in fp32 master weights) and one more forward per micro batch.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from spec_schema import FieldError
from training.objectives import unknown_options

LOSS_TYPES = ("sigmoid", "robust")
DEFAULTS: dict[str, Any] = {"beta": 0.1, "loss_type": "sigmoid", "label_smoothing": 0.0}
"""TRL 1.16.0 ``DPOConfig``'s defaults (beta 0.1, loss_type ["sigmoid"], label_smoothing 0.0)."""
DATA_KINDS = ("preference", "hf")
"""The data kinds that hold preference pairs (``hf``: a dataset with prompt/chosen/rejected columns)."""
EXTRA = ("rewards_chosen", "rewards_rejected", "rewards_correct", "logps_chosen", "logps_rejected")


def check(options: dict[str, Any]) -> None:
    unknown_options(options, DEFAULTS)
    opts = settings(options)
    beta = opts["beta"]
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta > 0 or not math.isfinite(beta):
        raise FieldError("beta", beta, "must be a number > 0 (the KL penalty's weight; TRL's default 0.1)")
    if opts["loss_type"] not in LOSS_TYPES:
        raise FieldError("loss_type", opts["loss_type"], f"is not allowed (allowed: {', '.join(LOSS_TYPES)})")
    eps = opts["label_smoothing"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 <= eps < 0.5:
        raise FieldError("label_smoothing", eps, "must be a number in [0, 0.5)")
    if eps and opts["loss_type"] == "sigmoid":
        raise FieldError("label_smoothing", eps, "is unused by loss_type 'sigmoid' (TRL 1.16); set loss_type = "
                                                 "'robust' to train with label smoothing, or 0")


def settings(options: dict[str, Any]) -> dict[str, Any]:
    return {**DEFAULTS, **options}


def pair_segments(batch: Mapping[str, Any], forward: Any) -> tuple[Any, int]:
    """``(segment of every target, pairs)`` from a HOST batch: segment ``2p`` is pair p's chosen
    sequence, ``2p + 1`` its rejected one; targets in the order of ``labels[:, 1:] != -100``
    (row-major, as training/model.py ``loss_inputs`` keeps them). ``forward``: training/model.py."""
    segment, sequences = forward.document_segments(batch)
    if sequences % 2:
        raise ValueError(f"a preference batch holds {sequences} sequences with completion tokens: pairs need an "
                         "even number (chosen, rejected)")
    return segment, sequences // 2


def sequence_logps(token_losses: Any, segment: Any, pairs: int) -> tuple[Any, Any]:
    """The summed log-probabilities of each pair's chosen and rejected completion."""
    import torch

    sums = torch.zeros(2 * pairs, dtype=torch.float32, device=token_losses.device)
    sums = sums.index_add(0, segment.to(token_losses.device), -token_losses.float())
    return sums[0::2], sums[1::2]


def pair_losses(chosen: Any, rejected: Any, ref_chosen: Any, ref_rejected: Any, *, beta: float,
                loss_type: str = "sigmoid", label_smoothing: float = 0.0) -> Any:
    """Each pair's loss (TRL 1.16 ``_compute_loss``, f_divergence ``reverse_kl``)."""
    import torch.nn.functional as F

    delta = (chosen - ref_chosen) - (rejected - ref_rejected)
    if loss_type == "sigmoid":
        return -F.logsigmoid(beta * delta)
    eps = label_smoothing  # robust
    return (-(1 - eps) * F.logsigmoid(beta * delta) + eps * F.logsigmoid(-beta * delta)) / (1 - 2 * eps)


class DPO:
    extra: Sequence[str] = EXTRA

    def __init__(self, *, beta: float, loss_type: str, label_smoothing: float, forward: Any, frozen: Any = None):
        self.beta, self.loss_type, self.label_smoothing = float(beta), loss_type, float(label_smoothing)
        self.forward = forward
        """training/model.py (handed in: see the package docstring)."""
        self.frozen = frozen
        """The reference copy of a full fine-tune (parallelized by the loop beside the policy); None with LoRA."""

    def units(self, batch: Mapping[str, Any]) -> float:
        return float(pair_segments(batch, self.forward)[1])

    def reference_losses(self, model: Any, batch: Mapping[str, Any], device: Any) -> Any:
        import torch

        token_losses = self.forward.token_losses
        with torch.no_grad():
            if self.frozen is not None:
                return token_losses(self.frozen, batch, device)
            from training.model_transforms.lora import adapters_disabled

            was_training = model.training
            model.eval()  # the reference has no dropout (TRL runs it under no_grad with the adapters off)
            try:
                with adapters_disabled(model):
                    return token_losses(model, batch, device)
            finally:
                model.train(was_training)

    def loss(self, model: Any, batch: Mapping[str, Any], device: Any) -> tuple[Any, Any]:
        import torch

        segment, pairs = pair_segments(batch, self.forward)
        ref_c, ref_r = sequence_logps(self.reference_losses(model, batch, device), segment, pairs)
        chosen, rejected = sequence_logps(self.forward.token_losses(model, batch, device), segment, pairs)
        losses = pair_losses(chosen, rejected, ref_c, ref_r, beta=self.beta, loss_type=self.loss_type,
                             label_smoothing=self.label_smoothing)
        with torch.no_grad():
            r_c, r_r = self.beta * (chosen - ref_c), self.beta * (rejected - ref_r)
            extra = torch.stack([r_c.sum(), r_r.sum(), (r_c > r_r).float().sum(), chosen.sum(), rejected.sum()])
        return losses.sum(), extra.double()

    def figures(self, sums: Sequence[float], prefix: str = "") -> dict[str, Any]:
        loss, pairs, r_c, r_r, correct, l_c, l_r = sums
        if pairs <= 0:
            return {f"{prefix}loss": float("nan")}
        return {f"{prefix}loss": loss / pairs, f"{prefix}rewards_chosen": r_c / pairs,
                f"{prefix}rewards_rejected": r_r / pairs, f"{prefix}rewards_margin": (r_c - r_r) / pairs,
                f"{prefix}rewards_accuracy": correct / pairs, f"{prefix}logps_chosen": l_c / pairs,
                f"{prefix}logps_rejected": l_r / pairs, f"{prefix}pairs": int(pairs)}


def make(model: Any, job: Any, forward: Any) -> DPO:
    """The objective for ``model`` (built and transformed, not yet parallelized): with LoRA the
    reference is the model with its adapters off; else a frozen copy made here, before FSDP."""
    import copy

    from training.model_transforms.lora import lora_settings

    opts = settings(dict(job.train.objective_options))
    frozen = None
    if lora_settings(model) is None:
        frozen = copy.deepcopy(model)
        frozen.requires_grad_(False)
        frozen.eval()
    return DPO(beta=opts["beta"], loss_type=opts["loss_type"], label_smoothing=opts["label_smoothing"],
               forward=forward, frozen=frozen)
