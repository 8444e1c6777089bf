"""Check the data a job will read BEFORE any worker starts: ``python -m training --check``,
the preflight and the job's own driver call :func:`check_data`.

Standard library only (pyarrow only for ``s3://`` and Hugging Face files, as the job itself). It
reads the data with the very reader the job uses (the ``data.kind``'s entry in
training/data/formats/), so a file it passes is one the job reads, and a file it refuses fails
with the same one line, naming the file and the line (or row):

- local files: read in full up to :data:`LOCAL_FULL_BYTES` each, else their first
  :data:`HEAD_BYTES` (said in the summary);
- ``s3://``: the objects are listed and the first :data:`HEAD_BYTES` of each is read (of a
  ``.json`` array or a Parquet/Arrow file: the records those bytes hold). A prefix
  holding ``{bucket}`` (filled in from the environment by the charts and the preflight) or an
  S3 that cannot be reached from here is not read, and the summary says why.

Beyond each record: at least one usable document, conversations where ``eval.exact_match``
needs them, a held-out split that the configured
``data.eval_fraction`` actually fills, and enough text for one global batch (counted as an UPPER
bound of tokens, so a corpus is only refused when it is certainly too small).
"""
from __future__ import annotations

from dataclasses import dataclass

from training.contract import BUCKET_PLACEHOLDER
from training.data import formats
from training.data.records import DataError, Reader
from training.storage.files import RemoteFile, filesystem_for, is_s3, list_files, split_s3
from training.data.tokenizer import chat_template_text, tokenizer_location

LOCAL_FULL_BYTES = 256 * 1024**2
"""Local files up to this size are read in full."""
HEAD_BYTES = 4 * 1024**2
"""Of a larger local file, and of every S3 object, the first bytes read (cut at the last newline)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DataCheck:
    """What the check read: ``summary`` is one line for the report; ``skipped`` says why not."""
    checked: bool
    summary: str
    documents: int = 0
    files: int = 0
    complete: bool = True
    """Every byte of every file was read (the counts are exact, not a head's lower bound)."""


def _limit(f: RemoteFile, head_bytes: int) -> int | None:
    """How much of a file the check reads: all of a local file up to LOCAL_FULL_BYTES."""
    return None if not is_s3(f.uri) and f.size <= LOCAL_FULL_BYTES else head_bytes


def _listing(job, path: str, kind: str) -> list[RemoteFile]:
    try:
        return formats.files_of(path, kind)
    except FileNotFoundError as err:
        wanted = formats.reads(kind)
        others = ""
        if not is_s3(path):
            try:
                names = sorted({f.uri.rsplit(".", 1)[-1] for f in list_files(path)})
                others = f"; it holds .{', .'.join(names)} files" if names else ""
            except FileNotFoundError:
                pass
        raise DataError(f"{job.source}: data.path: {err} (data.kind {kind!r} reads {wanted}{others})") from None


def _bucket_exists(path: str) -> bool:
    """A missing BUCKET is a plan made before the deploy (a note); a missing prefix in an
    existing bucket is data not uploaded (refused)."""
    from pyarrow import fs

    s3, where = filesystem_for(path)
    return s3.get_file_info(where.split("/", 1)[0]).type != fs.FileType.NotFound


def _token_upper_bound(documents, template_bytes: int = 0) -> int:
    """At most this many tokens: a byte-level BPE token covers at least one UTF-8 byte; plus one
    separator per document and, per conversation, what its chat template (of ``template_bytes``
    bytes) writes around the messages. A Jinja template writes only its own literals and short
    variables (a special token, a date) that are shorter than the tags naming them: at most its
    own size once, and once more per message its loop renders."""
    total = 0
    for d in documents:
        if d.pair:  # two sequences: prompt + chosen, prompt + rejected (training/data/tokenizer.py tokenize_pair)
            prompt, chosen, rejected = d.pair
            for side in (chosen, rejected):
                if isinstance(prompt, str):  # + the eos TRL appends and a BOS the tokenizer may add
                    total += len(prompt.encode("utf-8")) + len(side.encode("utf-8")) + 2
                else:
                    turns = tuple(prompt) + tuple(side)
                    total += sum(len(m["content"].encode("utf-8")) for m in turns) + (len(turns) + 1) * template_bytes
        elif d.messages:
            total += sum(len(m["content"].encode("utf-8")) for m in d.messages)
            total += (len(d.messages) + 1) * template_bytes
        else:
            total += len(d.text.encode("utf-8"))
        total += 1
    return total


def check_data(job, *, head_bytes: int = HEAD_BYTES) -> DataCheck:
    """Read and check ``job.data``; raises :class:`DataError` (one line) for unusable data."""
    d = job.data
    if d.kind == "synthetic":
        return DataCheck(checked=False, summary="synthetic token ids: no data to read")
    if BUCKET_PLACEHOLDER in d.path:
        return DataCheck(checked=False, summary=f"{d.path} not read: {BUCKET_PLACEHOLDER} is filled in from environment.toml "
                                                "(run raytrain-eks preflight --job ... to check it)")
    try:
        if is_s3(d.path) and not _bucket_exists(d.path):
            bucket = split_s3(d.path)[0]
            return DataCheck(checked=False, summary=f"{d.path} not read: the bucket {bucket} does not exist (yet); "
                                                    "deploy the storage stack and upload the data")
        files = _listing(job, d.path, d.kind)
    except OSError as err:  # S3 unreachable from this machine (no credentials, no network)
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return DataCheck(checked=False, summary=f"{d.path} not read: S3 not reachable from here ({first[:160]})")
    reader, fmt = Reader(d.on_bad_record), formats.get(d.kind)
    complete, read = True, 0
    try:
        for f in files:
            limit = _limit(f, head_bytes)
            complete &= fmt.read(reader, f, limit)
            read += f.size if limit is None else min(f.size, limit)
        if reader.result.documents:
            formats.one_shape(reader.result.documents)
    except DataError as err:
        raise DataError(f"{job.source}: data.path: {err}") from None
    except OSError as err:
        raise DataError(f"{job.source}: data.path: {d.path}: cannot read ({err})") from None
    docs = reader.result.documents
    n = len(docs)
    if not docs:
        raise DataError(f"{job.source}: data.path: {d.path}: no usable {d.kind} documents "
                        f"({reader.result.bad_records} bad records skipped in {len(files)} files)")
    chats = bool(docs[0].messages) or (bool(docs[0].pair) and not isinstance(docs[0].pair[0], str))
    template = _chat_template(job, d.kind) if chats else None
    if job.eval.exact_match and not docs[0].messages:
        raise DataError(f"{job.source}: eval.exact_match: True needs conversations, but {d.path} holds text "
                        f"documents (data.kind {d.kind!r})")
    overlong = _overlong(job, docs) if template is not None else None
    if complete:  # conversations with a template not read here: their size is not bounded
        _check_size(job, docs, None if chats and template is None else len((template or "").encode("utf-8")))
    size = f"{head_bytes / 1024**2:g} MiB" if head_bytes >= 1024**2 else f"{head_bytes / 1024:g} KiB"
    scope = "read in full" if complete else f"first {size} of each file read"
    bad = f", {reader.result.bad_records} bad records to skip" if reader.result.bad_records else ""
    if reader.result.dropped_turns:
        bad += f", {reader.result.dropped_turns} leading assistant turns dropped"
    if overlong:
        bad += (f"; warning: {overlong} of {n} conversations are longer than train.seq_len {job.train.seq_len} "
                f"and will be cut to it (data.overlong = 'truncate'; 'refuse' refuses them, a longer seq_len keeps them)")
    return DataCheck(checked=True, documents=n, files=len(files), complete=complete,
                     summary=f"{d.path}: {n} {d.kind} documents in {len(files)} file(s), {read} bytes {scope}{bad}")


def _overlong(job, docs) -> int | None:
    """How many conversations are longer than ``train.seq_len`` once tokenized as the job
    tokenizes them (with the separator it appends: training/data/packing.py ``_pack_whole``); with
    ``data.overlong = "refuse"`` the first one is refused here, naming its file and line, before
    any worker starts. None: the tokenizer is not a local directory here (the job still applies
    the policy; run.json counts what it cut)."""
    import importlib.util
    from pathlib import Path

    where = tokenizer_location(job.model)
    if "://" in where or not Path(where).is_dir() or importlib.util.find_spec("transformers") is None:
        return None
    from training.data.tokenizer import tokenize_documents
    from training.data.tokenizer import load_tokenizer

    seq_len = job.train.seq_len
    lengths = [len(t.ids) + 1 for t in tokenize_documents(load_tokenizer(where), docs)]
    over = [(doc, size) for doc, size in zip(docs, lengths) if size > seq_len]
    if over and job.data.overlong == "refuse":
        doc, size = over[0]
        raise DataError(f"{job.source}: data.path: {doc.source}, line {doc.line}: a conversation of {size - 1} tokens "
                        f"does not fit train.seq_len = {seq_len} ({len(over)} of {len(docs)} do not; "
                        "data.overlong = 'refuse'; set 'truncate' or a longer seq_len)")
    return len(over)


def _chat_template(job, kind: str) -> str | None:
    """The job's chat template (None: its tokenizer is not a local directory); conversations with
    a tokenizer that has none are refused here, before any worker starts."""
    where = tokenizer_location(job.model)
    template = chat_template_text(where)
    if template == "":
        field = "model.tokenizer" if job.model.tokenizer or not job.model.path else "model.path"
        raise DataError(f"{job.source}: {field}: {where}: the tokenizer has no chat template (chat_template.jinja or "
                        f"tokenizer_config.json \"chat_template\"), but data.kind {kind!r} holds conversations: "
                        "give model.tokenizer a tokenizer that has one")
    return template


def _check_size(job, docs, template_bytes: int | None) -> None:
    d, t = job.data, job.train
    n = len(docs)
    if n < 2 or round(n * d.eval_fraction) < 1:
        need = max(2, int(0.5 / d.eval_fraction) + 1)
        raise DataError(f"{job.source}: data.path: {d.path}: {n} document(s); data.eval_fraction {d.eval_fraction:g} "
                        f"holds out none (needs at least {need} documents, or a larger eval_fraction)")
    if template_bytes is None:
        return
    n_eval = min(n - 1, round(n * d.eval_fraction))
    # The train split is the documents not held out; at most all but the n_eval smallest.
    sizes = sorted(_token_upper_bound([doc], template_bytes) for doc in docs)
    train_tokens = sum(sizes[n_eval:])
    batch = t.global_batch_size * t.seq_len
    if train_tokens < batch:
        raise DataError(f"{job.source}: data.path: {d.path}: the train split holds at most {train_tokens} tokens, "
                        f"less than one global batch (train.global_batch_size {t.global_batch_size} x train.seq_len "
                        f"{t.seq_len} = {batch})")
