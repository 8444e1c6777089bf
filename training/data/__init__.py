"""Training data: read, tokenize, split, pack and stream, with the data position as trainer state.

Interface for the training loop
-------------------------------
::

    from training.data import build_data, DataError
    bundle = build_data(cfg, tokenizer, rank=rank, world_size=world_size)   # once per worker

``cfg`` is the JobConfig (sections ``data``, ``train``, ``eval``, ``model``); ``tokenizer`` is from
``training.tokenizer.load_tokenizer`` (may be ``None`` for ``data.kind = "synthetic"``, then the
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
content + the end-of-turn token the template closes it with (training/data/tokenize.py).
``data.path``: a file, a directory or an ``s3://`` object/prefix (pyarrow S3, honours
``AWS_ENDPOINT_URL``).

Tokenization happens once per node: the first process builds the packed corpus into a
node-local cache (``RAYTRAIN_CACHE_DIR`` or ``$TMPDIR/raytrain-eks-cache``) under a file lock,
the others load it (``build_data(..., cache_dir=...)`` overrides the location). Each rank then
only materialises its own samples. The held-out split is chosen per DOCUMENT from the seed and
the document's content (``data.eval_fraction``), before packing; see ``packing.py``.
"""
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
    "SyntheticStream", "TrainStream", "build_data",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'training.data' has no attribute {name!r}")
