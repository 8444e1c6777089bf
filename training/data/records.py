"""What a data format is made of: documents, the bad-record policy and the format interface.

A *document* is the unit that is tokenized, separated from the next by ``<|endoftext|>`` when
packed, and assigned as a whole to the train or the held-out split. It is either ``text``
(trained on every token), ``messages`` (a conversation: trained on the assistant turns) or a
preference ``pair`` (two sequences, prompt + chosen and prompt + rejected: DPO). The
code after the reader branches on the document, never on the format that produced it.

A :class:`DataFormat` is one entry of the registry (``training/data/formats/``, one file per
``data.kind``): which files it reads and how one file becomes documents. Formats whose files hold
one JSON object per record give a record converter (:attr:`DataFormat.record`) and get their
reader from :func:`record_format`; a container such as ``hf`` reuses those converters for its rows.

Malformed input raises :class:`DataError` (one line: file, line or row, field, value, what is
expected) or, with ``on_bad_record="skip"``, is skipped and counted; never silently dropped.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from training.storage.files import RemoteFile, filesystem_for, is_s3, read_stored


class DataError(ValueError):
    """Unusable training data; ``str(err)`` is one line naming the file and line."""


class BadRecord(ValueError):
    """One record a format cannot use; the reader adds the file and line (or row)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Document:
    """One document: ``text`` or ``messages`` (a conversation), and where it came from."""

    source: str
    line: int
    text: str = ""
    messages: tuple[dict[str, str], ...] = ()
    pair: tuple[Any, ...] = ()
    """A preference pair ``(prompt, chosen, rejected)``: three strings, or three tuples of messages
    (training/data/formats/preference.py)."""


@dataclass(kw_only=True, slots=True)
class ReadResult:
    documents: list[Document] = field(default_factory=list)
    bad_records: int = 0
    files: list[str] = field(default_factory=list)
    fingerprint: list[list[Any]] = field(default_factory=list)
    """(uri, size, mtime) of every file read: part of the node-local cache key."""
    dropped_turns: int = 0
    """Turns a format drops by its upstream rule (ShareGPT's leading assistant turns), for the report."""


class Reader:
    """Collects documents and applies ``data.on_bad_record`` (``error`` raises, ``skip`` counts)."""

    def __init__(self, on_bad_record: str):
        self.skip = on_bad_record == "skip"
        self.result = ReadResult()

    def bad(self, source: str, number: int, problem: str, unit: str = "line") -> None:
        """A bad record at line (or ``unit``: row) ``number`` of ``source``."""
        if not self.skip:
            raise DataError(f"{source}, {unit} {number}: {problem}")
        self.result.bad_records += 1


@dataclass(frozen=True, kw_only=True, slots=True)
class DataFormat:
    """One ``data.kind``: the files it reads and how one of them becomes documents."""

    summary: str
    """What one record looks like, for errors and docs."""
    suffixes: tuple[str, ...]
    """The files it reads under a directory or prefix."""
    read: Callable[[Reader, RemoteFile, int | None], bool]
    """``read(reader, file, limit)``: append the file's documents to ``reader``, reading at most
    about ``limit`` bytes (None: all); True when the whole file was read."""
    record: Callable[[dict], dict[str, Any]] | None = None
    """For record formats: one record (a JSON object or a table row) -> the :class:`Document`
    fields (``text`` or ``messages``; and ``dropped_turns``, counted in :class:`ReadResult`);
    raises :class:`BadRecord`."""
    columns: tuple[str, ...] = ()
    """The fields that mark a record of this format (how ``hf`` picks the converter for its rows)."""
    conversations: bool = False
    """Its documents are conversations."""
    files: Callable[[str], list[RemoteFile]] | None = None
    """The files under a path, in reading order (None: every file with one of :attr:`suffixes`)."""


def read_head(f: RemoteFile, limit: int | None) -> tuple[bytes, bool]:
    """(bytes, complete): the whole file, or its first ``limit`` bytes cut at the last newline."""
    if is_s3(f.uri):
        s3, path = filesystem_for(f.uri)
        data = read_stored(s3, path, None if limit is None else limit + 1)
    else:
        with open(f.uri, "rb") as handle:
            data = handle.read() if limit is None else handle.read(limit + 1)
    if limit is None or len(data) <= limit:
        return data, True
    cut = data[:limit].rfind(b"\n")
    return (data[:cut + 1] if cut >= 0 else data[:limit]), False


def bytes_format(parse: Callable[[Reader, str, bytes, bool], None]) -> Callable[[Reader, RemoteFile, int | None], bool]:
    """A :attr:`DataFormat.read` for formats that parse a file's bytes: ``parse(reader, source,
    raw, complete)``, where ``complete`` is False for a head cut at a newline under a limit."""
    def read(reader: Reader, f: RemoteFile, limit: int | None) -> bool:
        raw, complete = read_head(f, limit)
        if not raw.strip():
            reader.bad(f.uri, 1, "empty file")
        else:
            parse(reader, f.uri, raw, complete)
        return complete
    return read


ARRAY_HINT = "the file is one JSON array, not JSON Lines: write one object per line (e.g. jq -c '.[]')"


def found(record: dict) -> str:
    """``; found: a, b`` (the record's own keys), to show a wrong field name next to the right one."""
    keys = ", ".join(sorted(map(str, record))[:6])
    return f"; found: {keys}" if keys else "; the object is empty"


def shown(value: Any) -> str:
    """A record's value as an error shows it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def json_records(reader: Reader, source: str, raw: bytes, *, arrays: bool, complete: bool = True) -> Iterator[tuple[int, Any]]:
    """``(line, value)`` of every record: one JSON value per line (JSON Lines) or, with ``arrays``,
    also a file that is one JSON array (each element's line is where it starts; of an incomplete
    head, the elements it holds whole)."""
    if arrays and raw.lstrip().startswith(b"["):
        yield from _array_records(reader, source, raw, complete)
        return
    first = True
    for number, line_bytes in enumerate(raw.split(b"\n"), 1):
        if not line_bytes.strip():
            continue
        array_start, first = first and line_bytes.lstrip().startswith(b"["), False
        try:
            record = json.loads(line_bytes.decode("utf-8"))
        except UnicodeDecodeError:
            reader.bad(source, number, "not valid UTF-8")
            continue
        except json.JSONDecodeError as err:
            hint = f"; {ARRAY_HINT}" if array_start else ""
            reader.bad(source, number, f"not valid JSON ({err.msg} at column {err.colno}){hint}")
            continue
        if isinstance(record, list) and array_start and len(record) > 1:
            reader.bad(source, number, f"expected a JSON object, got list; {ARRAY_HINT}")
            continue
        yield number, record


def _array_records(reader: Reader, source: str, raw: bytes, complete: bool) -> Iterator[tuple[int, Any]]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        reader.bad(source, raw[:err.start].count(b"\n") + 1, "not valid UTF-8")
        return
    decoder, pos = json.JSONDecoder(), text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        line = text.count("\n", 0, pos) + 1
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            # the rest of an array cannot be read past a syntax error: one bad record, then stop.
            # A head is cut at a newline, so an element it cuts off fails at the head's very end.
            if complete or text[err.pos:].strip():
                reader.bad(source, err.lineno, f"not valid JSON ({err.msg} at column {err.colno})")
            return
        yield line, record


def record_format(*, summary: str, record: Callable[[dict], dict[str, Any]], columns: tuple[str, ...],
                  conversations: bool, arrays: bool = False) -> DataFormat:
    """A format of JSON Lines files (and, with ``arrays``, ``.json`` files holding one array)."""
    def parse(reader: Reader, source: str, raw: bytes, complete: bool) -> None:
        for line, value in json_records(reader, source, raw, arrays=arrays, complete=complete):
            if not isinstance(value, dict):
                reader.bad(source, line, f"expected a JSON object, got {type(value).__name__}")
                continue
            add_record(reader, source, line, value, record)

    return DataFormat(summary=summary, suffixes=(".jsonl", ".json") if arrays else (".jsonl",),
                      read=bytes_format(parse), record=record, columns=columns, conversations=conversations)


def add_record(reader: Reader, source: str, number: int, value: dict,
               record: Callable[[dict], dict[str, Any]], unit: str = "line") -> None:
    """Convert the record at line (or ``unit``) ``number`` and keep its document, or report it as bad."""
    try:
        fields = record(value)
    except BadRecord as err:
        reader.bad(source, number, str(err), unit)
        return
    reader.result.dropped_turns += fields.pop("dropped_turns", 0)
    reader.result.documents.append(Document(source=source, line=number, **fields))


def string_field(record: dict, name: str, *, required: bool = True) -> str:
    """``record[name]`` as a non-empty string (``required``) or a string, else :class:`BadRecord`."""
    if name not in record or (record[name] is None and not required):
        if required:
            raise BadRecord(f"missing field {name!r}{found(record)}")
        return ""
    value = record[name]
    if not isinstance(value, str):
        raise BadRecord(f"field {name!r} must be a string, got {type(value).__name__} ({shown(value)})")
    if required and not value.strip():
        raise BadRecord(f"field {name!r} is empty")
    return value
