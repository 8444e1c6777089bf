"""Training data: read, tokenize, split, pack and stream, with the data position as trainer state.

Interface for the training loop
-------------------------------
::

    from training.data import build_data, DataError
    bundle = build_data(cfg, tokenizer, rank=rank, world_size=world_size)   # once per worker

``cfg`` is the JobConfig (sections ``data``, ``train``, ``eval``, ``model``); ``tokenizer`` is from
``training.data.tokenizer.load_tokenizer`` (may be ``None`` for ``data.kind = "synthetic"``, then the
vocabulary is ``model.config["vocab_size"]`` or 151,936). Errors a user can cause (missing
path, malformed records under ``on_bad_record = "error"``, too few documents) raise
:class:`DataError`, whose text is ONE line naming the file and line; catch it at the entry point.

``bundle.train`` (a :class:`TrainStream`)
    ``next_batch()`` -> ``{"input_ids": LongTensor[micro_batch_size, seq_len],
    "labels": LongTensor[micro_batch_size, seq_len]}``, on CPU. Labels are ALIGNED with
    input_ids, NOT shifted: pass both to a Hugging Face causal LM, which shifts inside its loss.
    -100 = not a target (chat prompts, the chat separator, padding). Call it
    ``grad_accum_steps`` times per optimizer step (``bundle.train.grad_accum_steps`` =
    global_batch / (world_size x micro_batch)). It never ends: past one pass over the blocks it
    starts the next epoch with a fresh permutation seeded by (data.seed, epoch).
    ``epoch``, ``step``, ``consumed_samples`` describe the position.

    ``state_dict()`` / ``load_state_dict(state)``: the data position (a small dict of ints and
    strings, JSON-safe). Take it at an optimizer-step boundary (it is then identical on every
    rank, so rank 0 can save it alone); a run resumed from it sees exactly the samples an
    uninterrupted run would have seen next, also with another world size or micro batch as long
    as the global batch is the same. A state from different data or seed is refused (DataError).

    Sample layout: step ``s`` uses global samples ``[s*G, (s+1)*G)``; rank ``r``'s micro-step ``a``
    takes ``micro`` samples from ``s*G + (a*world + r)*micro``. So the union of a step's batches
    over ranks and micro-steps is the same set whatever the world size: a 2-worker run and a
    1-process run with the same global batch see the same data.

``bundle.eval_batches(max_batches=None)`` -> list of batches (same format), SHARDED: rank r gets
    its round-robin share of the held-out blocks, every rank the same number of batches (at most
    ``eval.max_batches``), so all FSDP ranks run the same number of forwards. Where the blocks
    run out, a slot repeats a block with labels all -100. Compute held-out loss as
    (sum over ranks of summed token losses) / (sum over ranks of target counts), targets being
    ``labels[:, 1:] != -100`` after the shift; perplexity = exp(loss). The same list every call.

``bundle.eval_prompts`` -> list of :class:`EvalPrompt` (``prompt_ids``, ``answer``) for chat
    data: the held-out conversations up to their last assistant turn, rendered with the
    generation prompt; ``answer`` is that turn's text, for exact match. Same list on every rank.

``bundle.stats`` (:class:`DataStats`, ``.to_dict()`` for the run record): kind, is_synthetic,
    documents, train_documents, eval_documents, tokens, blocks, eval_blocks, padding_fraction,
    target_fraction, tokens_dropped, bad_records_skipped, files.

Kinds (``data.kind``): ``synthetic`` (random ids, seeded; infrastructure checks only; stats say
``is_synthetic``) or a data format: one file each in ``training/data/formats/`` (the registry;
the file's name is the kind, its docstring says what it reads): ``text``, ``jsonl``, ``chat``,
``alpaca``, ``sharegpt``, ``hf``. A format yields documents, text or conversations; conversations
are rendered with the model's own chat template (its tokenizer's) and trained ONLY on assistant
content + the end-of-turn token the template closes it with (training/data/tokenizer.py).
``data.path``: a file, a directory or an ``s3://`` object/prefix (pyarrow S3, honours
``AWS_ENDPOINT_URL``).

Tokenization happens once per node: the first process builds the packed corpus into a
node-local cache (``RAYTRAIN_CACHE_DIR`` or ``$TMPDIR/raytrain-eks-cache``) under a file lock,
the others load it (``build_data(..., cache_dir=...)`` overrides the location). Each rank then
only materialises its own samples. The held-out split is chosen per DOCUMENT from the seed and
the document's content (``data.eval_fraction``), before packing; see ``packing.py``.

Data errors in a real run: found by a worker, reported by the driver in ONE line, never retried.

Ray Train retries any worker error up to ``checkpoint.max_failures`` times, and a data error is
deterministic: every retry would read the same bad line again. So a worker does not raise it.
:func:`agree_on_data` runs right after every rank has tried to open its data: the ranks agree
(one all-reduce) whether any failed; a failed rank writes a marker (what, where, which rank)
into the run directory, and then EVERY rank returns normally, so no rank waits in a collective
and Ray sees a finished run with nothing to retry. The driver reads the markers of its own
attempt (:func:`read_data_errors`) and ends the run as failed at the data stage.
"""
from __future__ import annotations

import json
from typing import Any

from training.data.records import DataError

# The rest loads on first use (numpy, torch): the data CHECK (training/data/check.py) and the
# records reader must import in milliseconds for `python -m training --check` and preflight.
_LAZY = {
    "DataBundle": "training.data.build", "DataStats": "training.data.build", "EvalPrompt": "training.data.build",
    "build_data": "training.data.build", "IGNORE_INDEX": "training.data.packing",
    "PackedStream": "training.data.stream", "SyntheticStream": "training.data.stream",
    "TrainStream": "training.data.stream",
}

__all__ = [
    "DataBundle", "DataError", "DataStats", "EvalPrompt", "IGNORE_INDEX", "PackedStream",
    "SyntheticStream", "TrainStream", "agree_on_data", "build_data", "one_line", "read_data_errors",
    "storage_writer",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'training.data' has no attribute {name!r}")


MARKER_PREFIX = "data-error-"


def marker_name(token: str, rank: int) -> str:
    return f"{MARKER_PREFIX}{token}-rank-{rank}.json"


def agree_on_data(error: DataError | None, *, rank: int, device: Any, write: Any) -> bool:
    """True when every rank opened its data; else the failed ranks have called ``write(payload)``.

    ``device``: where the flag tensor lives (cuda for NCCL, cpu for gloo)."""
    import torch
    import torch.distributed as dist

    if error is not None:
        write({"rank": rank, "error_class": type(error).__name__, "error": str(error)})
    flag = torch.tensor([1.0 if error is not None else 0.0], device=device)
    if dist.is_initialized():
        dist.all_reduce(flag)
    return float(flag.item()) == 0.0


def storage_writer(storage: Any, token: str, rank: int):
    """``write(payload)`` into Ray's run directory (``StorageContext``) as this rank's marker."""
    def write(payload: dict) -> None:
        fs, base = storage.storage_filesystem, storage.experiment_fs_path
        fs.create_dir(base, recursive=True)
        with fs.open_output_stream(f"{base}/{marker_name(token, rank)}") as out:
            out.write(json.dumps(payload).encode("utf-8"))
    return write


def read_data_errors(run_dir: str, token: str) -> list[dict]:
    """The markers this attempt's ranks wrote under ``run_dir``, lowest rank first."""
    import pyarrow.fs as pafs

    from training.storage.files import filesystem_for

    try:
        fs, path = filesystem_for(run_dir)
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except (OSError, ValueError):
        return []
    found = []
    for info in infos:
        name = info.path.rsplit("/", 1)[-1]
        if info.type == pafs.FileType.File and name.startswith(f"{MARKER_PREFIX}{token}-"):
            with fs.open_input_stream(info.path) as stream:
                found.append(json.loads(stream.read().decode("utf-8")))
    return sorted(found, key=lambda m: m.get("rank", 0))


def one_line(errors: list[dict]) -> str:
    """What, where, which rank: ``DataError on rank 0 (and 1 more): <file, line: problem>``."""
    first = errors[0]
    more = f" (and {len(errors) - 1} more rank{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{first.get('error_class', 'DataError')} on rank {first.get('rank')}{more}: {first.get('error')}"
