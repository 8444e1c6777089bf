"""Export: the trained model as a Hugging Face directory, in the model's OWN dtype.

The job exports at the end of training, on the workers (:func:`export_model`): the model's
shards are gathered to rank 0's host memory (only the model, never the optimizer state), cast
to the dtype the model was published in (bf16 for Qwen2.5; fp32 for models built from a
config) and written next to the checkpoints: ``<storage>/<run_name>/hf``. Nothing is
downloaded, and nothing runs on the head pod.

:func:`export_local` / :func:`export_hf` consolidate a stored checkpoint in ONE process with no
process group (DCP reassembles the full tensors when no process group exists), for runs exported afterwards.
The result holds ``config.json``, ``model.safetensors`` and the tokenizer and loads with
``AutoModelForCausalLM.from_pretrained``.

A failed export at the end of training (:func:`export_on_workers`) ends in the summary row the
workers return, never raised: Ray Train would retry an exception ``max_failures`` times, and a
retry does not change the export. The driver turns the summary into the record's status
(:func:`training.verdict.outcome`).
"""
from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from training import contract
from training.checkpointing import markers
from training.checkpointing.markers import completeness_problem
from training.checkpointing.state import tied_names
from training.config import JobConfig
from training.storage import files, join

log = logging.getLogger(__name__)
MODEL_CONFIG = "model_config.json"
_MODEL_PREFIX = "app.model."


def _stored_dtype(folder: Path) -> torch.dtype:
    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    for key, item in metadata.state_dict_metadata.items():
        if key.startswith(_MODEL_PREFIX) and hasattr(item, "properties"):
            return item.properties.dtype
    return torch.float32


def export_dtype(model_config: dict, default: torch.dtype) -> torch.dtype:
    """The dtype the model was published in (its config's ``dtype``), else ``default``."""
    name = model_config.get("dtype") or model_config.get("torch_dtype")
    value = getattr(torch, str(name).removeprefix("torch."), None) if name else None
    return value if isinstance(value, torch.dtype) else default


def stops_at_end_of_turn(generation_config, end_of_turn_id: int | None):
    """A copy of ``generation_config`` whose ``eos_token_id`` also holds the end-of-turn token the
    run taught answers to end with. ``generate()`` stops only on ``eos_token_id`` (transformers
    5.13 generation/utils.py:2044-2057), so a base model tuned on an instruct template whose
    end-of-turn is not its eos would otherwise run past the answer. Unchanged when already there."""
    from training.data.tokenizer import generation_eos_ids

    if generation_config is None or end_of_turn_id is None or end_of_turn_id in generation_eos_ids(generation_config):
        return generation_config
    stops = generation_config.eos_token_id
    stops = [] if stops is None else [stops] if isinstance(stops, int) else list(stops)
    updated = copy.deepcopy(generation_config)
    updated.eos_token_id = [*stops, int(end_of_turn_id)]
    return updated


def _write_hf(model: torch.nn.Module, out: Path, tokenizer_dir: str, generation_config=None) -> None:
    """``generation_config``: the base model's (its sampling defaults and stop ids; a model
    built from a config has none), with the run's end-of-turn among its stop ids
    (:func:`stops_at_end_of_turn`). Training turns the KV cache off (training/model.py); the
    exported model is for generation, so it is written with the cache on."""
    out.mkdir(parents=True, exist_ok=True)
    model.config.use_cache = True
    if generation_config is not None:
        model.generation_config = generation_config
    model.save_pretrained(out, safe_serialization=True)
    if tokenizer_dir:
        from training.data.tokenizer import load_tokenizer  # local dir or s3:// prefix (fetched once)

        load_tokenizer(tokenizer_dir).save_pretrained(out)


def export_model(model: torch.nn.Module, out_uri: str, *, model_config: dict, tokenizer_dir: str = "",
                 scratch: str | Path = "", end_of_turn_id: int | None = None) -> dict[str, dict[str, str]] | None:
    """Export the live (FSDP-sharded) model to ``out_uri``; EVERY rank calls it (the gather is
    a collective). ``end_of_turn_id``: the token the run's chat template ends answers with, added
    to the exported generation config's stop ids. Rank 0 writes and returns ``{kind: {"uri", "sha256"}}``: ``full``, or for a
    LoRA model ``merged`` (at ``out_uri``) and ``peft_adapter`` (:func:`adapter_uri`); the
    others return None."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    # Full tensors, one at a time, to rank 0's host memory only (cpu_offload): the GPUs never
    # hold the whole model, and the optimizer state stays where it is.
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    from training.model_transforms.lora import lora_settings, merge_unties, split_state

    lora = lora_settings(model)
    adapter = None
    config_values = {k: v for k, v in model_config.items() if k not in ("dtype", "torch_dtype")}
    if lora:  # the merged model (W + scaling * B @ A under the base names) and the peft adapter
        full, adapter = split_state(full, lora["alpha"] / lora["rank"])
        if merge_unties(tied_names(model)):  # a tied skeleton would hold ONE of the embedding and the merged head
            config_values["tie_word_embeddings"] = False
    dtype = export_dtype(model_config, torch.float32)
    config = AutoConfig.for_model(**config_values)
    config.dtype = dtype
    skeleton = AutoModelForCausalLM.from_config(config, dtype=dtype)
    skeleton.load_state_dict({key: value.to(dtype) for key, value in full.items()})
    del full
    written = {}
    with tempfile.TemporaryDirectory(prefix="raytrain-export-", dir=str(scratch) or None) as work:
        outputs = [(out_uri, "merged" if lora else "full")] + ([(adapter_uri(out_uri), "peft_adapter")] if lora else [])
        for uri, kind in outputs:
            target = Path(work) / kind if "://" in uri else Path(uri)
            if target.exists():
                shutil.rmtree(target)
            if kind == "peft_adapter":
                write_peft_adapter(target, adapter, lora, model_config.get("_name_or_path") or "")
            else:
                _write_hf(skeleton, target, tokenizer_dir,
                          stops_at_end_of_turn(getattr(model, "generation_config", None), end_of_turn_id))
            written[kind] = {"uri": uri, "sha256": directory_hash(target)}
            if "://" in uri:
                files.upload(target, uri)
    log.info("exported the model (%s) -> %s", dtype, out_uri)
    return written


def trained_end_of_turn(job: JobConfig) -> int | None:
    """The end-of-turn token the run's conversations were tokenized with (as
    training/data/tokenizer.py reads it: :func:`training.data.tokenizer.chat_format`), or None when
    the tokenizer has no chat template that closes a turn (synthetic data, plain text models)."""
    if job.data.kind == "synthetic":
        return None
    from training.data.records import DataError
    from training.data.tokenizer import chat_format, chat_template_problem, load_tokenizer, tokenizer_location

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
    from training.data.tokenizer import tokenizer_location

    out_uri = f"{ctx.run_dir.rstrip('/')}/hf" if ctx.run_dir else os.path.join(ctx.local_dir, "hf")
    try:
        end_of_turn = trained_end_of_turn(job)
        written = export_model(model, out_uri, model_config=model_config, tokenizer_dir=tokenizer_location(job.model),
                               scratch=ctx.checkpoint_root, end_of_turn_id=end_of_turn)
    except Exception as err:  # noqa: BLE001 - reported in one line by the driver
        return {contract.EXPORT_ERROR: f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
    return {contract.EXPORTED: out_uri, contract.EXPORTS: written or {}}


def adapter_uri(out_uri: str) -> str:
    """Where a LoRA run's peft adapter goes: beside the merged export (``<run>/hf-adapter``)."""
    return out_uri.rstrip("/") + contract.ADAPTER_SUFFIX


def write_peft_adapter(out: Path, adapter: dict, lora: dict, base_model: str) -> None:
    """``adapter_config.json`` + ``adapter_model.safetensors`` as peft 0.18.0 writes them
    (peft v0.18.0 ``utils/constants.py`` :349-350 ``SAFETENSORS_WEIGHTS_NAME``, ``CONFIG_NAME``)."""
    from safetensors.torch import save_file

    from training.model_transforms.lora import peft_adapter_config

    out.mkdir(parents=True, exist_ok=True)
    save_file(adapter, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps(peft_adapter_config(lora, base_model), indent=2) + "\n",
                                             encoding="utf-8")


def directory_hash(folder: Path) -> str:
    """The content hash of an exported folder: :func:`training.contract.tree_hash` over its
    files by relative name (the first 16 hex of a sha256)."""
    from training.contract import tree_hash

    return tree_hash([(p.relative_to(folder).as_posix(), p) for p in folder.rglob("*") if p.is_file()])


def export_local(checkpoint_dir: str | Path, out_dir: str | Path, *, tokenizer_dir: str = "") -> Path:
    """Consolidate the complete checkpoint in ``checkpoint_dir`` into ``out_dir``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = Path(checkpoint_dir)
    problem = completeness_problem(folder)
    if problem:
        raise RuntimeError(f"{folder}: not a complete checkpoint ({problem}): refusing to export it")
    config_path = folder / MODEL_CONFIG
    if not config_path.is_file():
        raise RuntimeError(f"{folder}: no {MODEL_CONFIG} (give CheckpointManager model_config=model.config.to_dict())")
    stored = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    if any(".lora_A." in key for key in stored):  # no base weights in it: the job rebuilds them
        raise RuntimeError(f"{folder}: a LoRA checkpoint holds the adapters only; the run's own export "
                           "has the merged model (<run>/hf) and the adapter (<run>/hf-adapter)")
    config_dict = json.loads(config_path.read_text(encoding="utf-8"))
    config = AutoConfig.for_model(**config_dict)
    dtype = _stored_dtype(folder)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    from training.checkpointing.state import drop_tied, restore_tied

    state = {"app": {"model": drop_tied(model, model.state_dict())}}  # tied tensors are stored once
    dcp.load(state, checkpoint_id=str(folder), no_dist=True)  # in place, into the model's tensors
    model.load_state_dict(restore_tied(model, state["app"]["model"]))
    model = model.to(export_dtype(config_dict, dtype))
    model.config.dtype = export_dtype(config_dict, dtype)
    out = Path(out_dir)
    _write_hf(model, out, tokenizer_dir)
    log.info("exported %s -> %s", folder, out)
    return out


def export_hf(checkpoint_uri: str, out_uri: str = "", *, tokenizer_dir: str = "") -> str:
    """Export a stored checkpoint (local path or ``s3://``) to ``out_uri`` (default: ``<run>/hf``)."""
    out_uri = out_uri or join(checkpoint_uri.rstrip("/").rsplit("/", 1)[0], "hf")
    with tempfile.TemporaryDirectory(prefix="raytrain-export-") as scratch:
        local = checkpoint_uri if "://" not in checkpoint_uri else str(files.download(checkpoint_uri,
                                                                                     Path(scratch) / "ckpt"))
        target = Path(scratch) / "hf" if "://" in out_uri else Path(out_uri)
        if target.exists():
            shutil.rmtree(target)
        export_local(local, target, tokenizer_dir=tokenizer_dir)
        if "://" in out_uri:
            files.upload(target, out_uri)
    return out_uri


def export_latest(run_uri: str, out_uri: str = "", *, tokenizer_dir: str = "") -> str:
    """Export the newest complete checkpoint of a run (the driver calls this after ``fit``)."""
    latest = markers.find_latest_complete(run_uri)
    if latest is None:
        raise RuntimeError(f"{run_uri}: no complete checkpoint to export")
    return export_hf(latest.uri, out_uri, tokenizer_dir=tokenizer_dir)
