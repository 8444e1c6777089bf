"""What a checkpoint holds, as DCP ``Stateful`` objects.

- :class:`ModelOptimizerState`: the (FSDP2-sharded) model and optimizer through
  ``torch.distributed.checkpoint.state_dict.get_state_dict / set_state_dict``, so each rank
  writes only its own shards and a different world size can still load them.
- :class:`TrainerState`: step, tokens seen, the data position (the train stream's
  ``state_dict()``), the LR scheduler and the RNG states of python, numpy and torch. Each rank's
  part is stored under its own key (``trainer.rank<r>``): RNG and data position differ per rank
  and DCP keeps only ONE copy of a key that several ranks write.
"""
from __future__ import annotations

import io
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful


class HasState(Protocol):
    """Anything with ``state_dict()`` / ``load_state_dict()`` (train stream, LR scheduler)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """``{alias: name}`` of parameters that are the same tensor as an earlier one (a tied output
    layer: Qwen2.5-1.5B's ``lm_head.weight`` IS ``model.embed_tokens.weight``)."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            aliases[name] = first[id(param)]
        else:
            first[id(param)] = name
    return aliases


def drop_tied(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """The model state dict with each tied tensor once (a checkpoint stores 233 M values less)."""
    aliases = tied_names(model)
    return {k: v for k, v in state.items() if k not in aliases}


def restore_tied(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """The model state dict with the tied aliases back (``load_state_dict(strict=True)`` wants them)."""
    return {**state, **{alias: state[name] for alias, name in tied_names(model).items() if name in state}}


class ModelOptimizerState(Stateful):
    """Model + optimizer, sharded as FSDP2 holds them (also works unsharded, one process).
    Tied parameters are stored once (:func:`drop_tied`)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None):
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        # Frozen parameters (a LoRA base model) are rebuilt by the job itself, never stored.
        options = StateDictOptions(ignore_frozen_params=bool(frozen_names(self.model)))
        if self.optimizer is None:
            return {"model": drop_tied(self.model, get_state_dict(self.model, [], options=options)[0])}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=options)
        return {"model": drop_tied(self.model, model_sd), "optim": optim_sd}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        model_sd = restore_tied(self.model, state["model"])
        frozen = frozen_names(self.model)
        if self.optimizer is None:
            missing = self.model.load_state_dict(model_sd, strict=not frozen).missing_keys
        else:
            missing = set_state_dict(self.model, self.optimizer, model_state_dict=model_sd,
                                     optim_state_dict=state["optim"],
                                     options=StateDictOptions(strict=not frozen)).missing_keys
        if set(missing) - frozen:  # only the frozen ones may be absent
            raise RuntimeError(f"checkpoint lacks trainable parameters: {sorted(set(missing) - frozen)[:5]}")


def frozen_names(model: torch.nn.Module) -> set[str]:
    """Names (state-dict keys) of the parameters that are not trained."""
    return {name for name, param in model.named_parameters(remove_duplicate=False) if not param.requires_grad}


def capture_rng() -> dict[str, Any]:
    """The RNG states of python, numpy and torch (CPU and, where present, CUDA) of this process,
    as tensors, ints, floats and strings only: what ``torch.load(weights_only=True)`` reads back
    (:func:`_from_bytes`)."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": int(version), "state": torch.tensor(words, dtype=torch.int64),
                   "gauss": gauss},
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():  # dropout masks on GPU come from the CUDA generator
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    python, numpy_state = state["python"], state["numpy"]
    if isinstance(python, dict):
        random.setstate((python["version"], tuple(int(w) for w in python["state"].tolist()), python["gauss"]))
    else:  # a checkpoint written before the states were tensors: the tuples themselves
        random.setstate(_as_tuple(python))
    if isinstance(numpy_state, dict):
        np.random.set_state((numpy_state["kind"], numpy_state["keys"].numpy().astype(np.uint32),
                             numpy_state["pos"], numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    else:
        np.random.set_state(_as_tuple(numpy_state))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _as_tuple(value: Any) -> Any:
    """``random.setstate`` wants tuples all the way down; a round trip may give lists."""
    if isinstance(value, list):
        return tuple(_as_tuple(v) for v in value)
    return value


@dataclass(kw_only=True, slots=True)
class TrainerState(Stateful):
    """The trainer's own progress; the loop updates ``step`` and ``tokens_seen`` in place.

    ``data`` and ``scheduler`` are live objects: saving reads their ``state_dict()`` and loading
    calls their ``load_state_dict()``.
    """

    step: int = 0
    """Optimizer steps completed."""
    tokens_seen: int = 0
    """Training tokens consumed over all ranks so far."""
    data: HasState | None = None
    """The train stream (its ``state_dict`` is the data position of THIS rank)."""
    scheduler: HasState | None = None
    """The LR scheduler."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Small JSON-able values the loop wants back after a resume (e.g. best eval loss)."""
    restored_from: str = ""
    """Set by a restore: the checkpoint it came from (not saved)."""

    def state_dict(self) -> dict[str, Any]:
        # One opaque blob: DCP flattens nested dicts key by key and loads only the keys the
        # target already has, so a data position whose shape changes would not survive.
        return {"payload": _to_bytes(self.snapshot())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.apply(_from_bytes(state["payload"]))

    def snapshot(self) -> dict[str, Any]:
        """The state as plain objects (what the checkpoint stores)."""
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "data": self.data.state_dict() if self.data is not None else {},
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else {},
            "rng": capture_rng(),
            "extra": dict(self.extra),
        }

    def apply(self, state: dict[str, Any]) -> None:
        """Put a :meth:`snapshot` back: counters, data position, scheduler, RNG."""
        self.step = int(state["step"])
        self.tokens_seen = int(state["tokens_seen"])
        if self.data is not None:
            self.data.load_state_dict(state["data"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.extra = dict(state.get("extra") or {})
        restore_rng(state["rng"])


def _to_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _from_bytes(blob: bytes) -> Any:
    """The trainer state with torch's restricted unpickler (``weights_only=True``): tensors,
    containers and primitive values only, so a state planted by anyone who could write the run's
    prefix cannot run code on load (a plain ``pickle`` load calls whatever the bytes name)."""
    import numpy._core.multiarray as multiarray

    # A state written before the RNG states were tensors holds numpy's RNG array: its data
    # types only (no callable that runs code) are allowed besides tensors.
    allowed = [multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(allowed):
        return torch.load(io.BytesIO(blob), weights_only=True)


def trainer_key(rank: int) -> str:
    """The DCP key of one rank's trainer state."""
    return f"trainer.rank{rank}"


def checkpoint_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                     trainer: TrainerState | None, rank: int) -> dict[str, Stateful]:
    """The dict handed to ``dcp.save`` / ``dcp.load`` on one rank."""
    state: dict[str, Stateful] = {"app": ModelOptimizerState(model, optimizer)}
    if trainer is not None:
        state[trainer_key(rank)] = trainer
    return state
