"""The data-format registry: ``data.kind`` selects a reader that yields documents.

One file per format in this folder: ``<kind>.py`` defines ``FORMAT``, a
:class:`~training.data.records.DataFormat`. The file's name IS the kind
(``training/config_checks.py: FILE_KINDS`` lists the folder, so the job config accepts a new
kind without a second edit). Everything after the reader (tokenizing, packing, the data check,
exact-match prompts) branches on the documents, never on the kind. Adding a format is adding
one file here; a record format (one JSON object per record) is then also read from Hugging Face
datasets by ``hf`` (its rows are matched to a record format by their columns).
"""
from __future__ import annotations

import importlib
from functools import cache

from training.config_checks import FILE_KINDS
from training.data.records import DataError, DataFormat, Reader, ReadResult
from training.storage.files import RemoteFile, list_files


@cache
def get(kind: str) -> DataFormat:
    """The format of ``data.kind`` (DataError for a kind without a file here)."""
    if kind not in FILE_KINDS:
        raise DataError(f"data kind {kind!r} has no reader (allowed: {', '.join(FILE_KINDS)})")
    return importlib.import_module(f"{__name__}.{kind}").FORMAT


def record_formats() -> list[tuple[str, DataFormat]]:
    """The formats with a record converter, in the order ``hf`` tries them on a table's columns:
    conversations first, then the one that needs more columns, then by name."""
    found = [(kind, get(kind)) for kind in FILE_KINDS if get(kind).record is not None]
    return sorted(found, key=lambda item: (not item[1].conversations, -len(item[1].columns), item[0]))


def files_of(path: str, kind: str) -> list[RemoteFile]:
    """The files ``kind`` reads under ``path``, in reading order (FileNotFoundError if none)."""
    fmt = get(kind)
    return fmt.files(path) if fmt.files is not None else list_files(path, fmt.suffixes)


def reads(kind: str) -> str:
    """``.jsonl/.json``: what a kind reads, for error messages."""
    return "/".join(get(kind).suffixes)


def read_documents(path: str, kind: str, *, on_bad_record: str = "error") -> ReadResult:
    """Every document under ``path`` (file, directory or ``s3://`` prefix), in file and record order."""
    fmt = get(kind)
    reader = Reader(on_bad_record)
    try:
        files = files_of(path, kind)
    except FileNotFoundError as err:
        raise DataError(f"{err} (data.kind {kind!r} reads {reads(kind)})") from None
    for f in files:
        reader.result.files.append(f.uri)
        reader.result.fingerprint.append([f.uri, f.size, f.mtime])
        fmt.read(reader, f, None)
    if not reader.result.documents:
        raise DataError(f"{path}: no usable {kind} documents "
                        f"({reader.result.bad_records} bad records skipped in {len(files)} files)")
    one_shape(reader.result.documents)
    return reader.result


def shape(doc) -> str:
    """What a document is: ``a preference pair``, ``a conversation`` or ``text``."""
    return "a preference pair" if doc.pair else "a conversation" if doc.messages else "text"


def one_shape(documents) -> None:
    """Text, conversations and preference pairs are packed differently: one corpus holds one of them."""
    first = documents[0]
    for doc in documents:
        if shape(doc) != shape(first):
            raise DataError(f"{doc.source}, line {doc.line}: {shape(doc)}, but {first.source}, line {first.line} is "
                            f"{shape(first)}: one job's data is all conversations, all text or all preference pairs")
