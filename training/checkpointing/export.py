"""Export: a complete checkpoint consolidated into a Hugging Face directory.

Runs in ONE process with no process group (DCP reads the shards of every rank and reassembles
the full tensors, pitfalls.md). The result holds ``config.json``, ``model.safetensors`` and the
tokenizer, loads with ``AutoModelForCausalLM.from_pretrained`` and gives the trained logits.
Default location: ``<storage>/<run_name>/hf`` next to the checkpoints.
"""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from training.checkpointing import storage
from training.checkpointing.marker import completeness_problem

log = logging.getLogger(__name__)
MODEL_CONFIG = "model_config.json"
_MODEL_PREFIX = "app.model."


def _stored_dtype(folder: Path) -> torch.dtype:
    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    for key, item in metadata.state_dict_metadata.items():
        if key.startswith(_MODEL_PREFIX) and hasattr(item, "properties"):
            return item.properties.dtype
    return torch.float32


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
    config_dict = json.loads(config_path.read_text(encoding="utf-8"))
    config = AutoConfig.for_model(**config_dict)
    dtype = _stored_dtype(folder)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = {"app": {"model": model.state_dict()}}
    dcp.load(state, checkpoint_id=str(folder), no_dist=True)  # in place, into the model's tensors
    model.load_state_dict(state["app"]["model"])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    if tokenizer_dir:
        from training.tokenizer import load_tokenizer  # local dir or s3:// prefix (fetched once)

        load_tokenizer(tokenizer_dir).save_pretrained(out)
    log.info("exported %s -> %s", folder, out)
    return out


def export_hf(checkpoint_uri: str, out_uri: str = "", *, tokenizer_dir: str = "") -> str:
    """Export a stored checkpoint (local path or ``s3://``) to ``out_uri`` (default: ``<run>/hf``)."""
    out_uri = out_uri or storage.join(checkpoint_uri.rstrip("/").rsplit("/", 1)[0], "hf")
    with tempfile.TemporaryDirectory(prefix="raytrain-export-") as scratch:
        local = checkpoint_uri if "://" not in checkpoint_uri else str(storage.download(checkpoint_uri, Path(scratch) / "ckpt"))
        target = Path(scratch) / "hf" if "://" in out_uri else Path(out_uri)
        if target.exists():
            shutil.rmtree(target)
        export_local(local, target, tokenizer_dir=tokenizer_dir)
        if "://" in out_uri:
            import pyarrow.fs as pafs

            fs, path = storage.filesystem_for(out_uri)
            pafs.copy_files(str(target), path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    return out_uri


def export_latest(run_uri: str, out_uri: str = "", *, tokenizer_dir: str = "") -> str:
    """Export the newest complete checkpoint of a run (the driver calls this after ``fit``)."""
    latest = storage.find_latest_complete(run_uri)
    if latest is None:
        raise RuntimeError(f"{run_uri}: no complete checkpoint to export")
    return export_hf(latest.uri, out_uri, tokenizer_dir=tokenizer_dir)
