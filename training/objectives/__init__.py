"""The objective registry: what a step's loss is (``train.objective``).

One file per objective in this folder; the file's name is the objective (``sft``: next-token
cross-entropy on the target tokens; ``dpo``: direct preference optimization). A file defines

- ``check(options)``: judge ``train.objective_options`` before any worker starts, raising
  ``spec_schema.FieldError(<option>, <value>, <what is allowed>)``; standard library only at
  module level (the job config imports it to check);
- ``settings(options)``: the options with their defaults filled in (what run.json records);
- ``make(model, job, forward)``: an :class:`Objective` for the built (transformed, not yet
  parallelized) model; torch is imported inside.

The training loop and the held-out evaluation call only the :class:`Objective` interface, so a
new objective is one new file here. ``forward`` is training/model.py itself, handed in by the
caller: the job config imports this room to check the options, so it sits below the model in
training/'s layers (tests/test_layers.py) and never imports it; an objective computes through
``forward.loss_sum``, ``forward.token_losses``, ``forward.count_targets`` and
``forward.document_segments``.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Mapping, Protocol, Sequence

from spec_schema import FieldError

DEFAULT = "sft"


def objective_names() -> tuple[str, ...]:
    """The registered objectives: this folder's modules, by name."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))


def get(name: str):
    """The objective's module (``check``, ``settings``, ``make``)."""
    return importlib.import_module(f"{__name__}.{name}")


def check_objective(name: str, options: Mapping[str, Any]) -> None:
    """``name`` is registered and ``options`` pass its own check (FieldError relative to
    ``[train]``: ``objective`` or ``objective_options.<key>``)."""
    names = objective_names()
    if name not in names:
        raise FieldError("objective", name, f"is not an objective (allowed: {', '.join(names)}; each is a file in "
                                            "training/objectives/)")
    try:
        get(name).check(dict(options))
    except FieldError as err:
        raise FieldError(f"objective_options.{err.field}", err.value, err.allowed) from None


def settings(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The objective's options with defaults filled in: what the run record stores."""
    return {"name": name, **get(name).settings(dict(options))}


def unknown_options(options: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    """FieldError for an option the objective does not have (a typo would silently do nothing)."""
    for key in options:
        if key not in defaults:
            raise FieldError(key, options[key], f"is not an option of this objective (known: {', '.join(defaults) or 'none'})")


class Objective(Protocol):
    """What the loop and the evaluation ask of an objective, one micro batch at a time.

    A step's loss is ``sum over the global batch of loss sums / sum of units``: each micro batch
    returns its loss SUM and the loop divides by the units of the whole global batch (one
    all-reduce), so the numbers do not depend on how the batch is split over ranks.
    """

    extra: Sequence[str]
    """Names of the extra sums :meth:`loss` returns beside the loss (summed over the global batch)."""

    def units(self, batch: Mapping[str, Any]) -> float:
        """What the loss is a mean over (target tokens, preference pairs), from the HOST batch."""

    def loss(self, model: Any, batch: Mapping[str, Any], device: Any) -> tuple[Any, Any]:
        """``(loss sum with grad, extra sums: a float64 tensor of len(extra), detached)``."""

    def figures(self, sums: Sequence[float], prefix: str = "") -> dict[str, Any]:
        """The row's figures from ``[loss sum, units, *extra sums]`` of the global batch."""
