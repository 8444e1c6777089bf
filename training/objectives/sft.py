"""``sft``: next-token cross-entropy on the target tokens (text: every token; conversations: the
assistant turns), the token-weighted mean over the global batch. No options."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from training.objectives import unknown_options

DEFAULTS: dict[str, Any] = {}


def check(options: dict[str, Any]) -> None:
    unknown_options(options, DEFAULTS)


def settings(options: dict[str, Any]) -> dict[str, Any]:
    return {**DEFAULTS, **options}


class SFT:
    extra: Sequence[str] = ()

    def __init__(self, forward: Any):
        self.forward = forward
        """training/model.py (handed in: see the package docstring)."""

    def units(self, batch: Mapping[str, Any]) -> float:
        return float(self.forward.count_targets(batch["labels"]))

    def loss(self, model: Any, batch: Mapping[str, Any], device: Any) -> tuple[Any, Any]:
        import torch

        return self.forward.loss_sum(model, batch, device), torch.zeros(0, dtype=torch.float64, device=device)

    def figures(self, sums: Sequence[float], prefix: str = "") -> dict[str, Any]:
        return {f"{prefix}loss": sums[0] / sums[1] if sums[1] > 0 else float("nan")}


def make(model: Any, job: Any, forward: Any) -> SFT:
    return SFT(forward)
