"""Read documents from plain text, JSONL ``{"text"}`` or chat JSONL ``{"messages"}`` files.

A *document* is the unit that is tokenized, separated from the next by ``<|endoftext|>`` when
packed, and assigned as a whole to the train or the held-out split:

- ``text``: files ending ``.txt``/``.md``/``.text``; a document is a run of non-blank lines
  (documents are separated by one or more blank lines).
- ``jsonl``: files ending ``.jsonl``; one ``{"text": "..."}`` object per line.
- ``chat``: files ending ``.jsonl``; one ``{"messages": [{"role", "content"}, ...]}`` per line,
  roles ``system``/``user``/``assistant``, at least one assistant message after a user message.

A path is a file, or a directory / ``s3://`` prefix whose matching files are read in sorted
order. Malformed input raises :class:`DataError` (one line: file, line, what is wrong, what is
expected) or, with ``on_bad_record="skip"``, is skipped and counted; never silently dropped.
(Invalid UTF-8 inside a plain-text file is counted once per file under "skip" and decoded with
U+FFFD replacement characters, since a text file has no record boundary to skip to.)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from training.data.remote import list_files, read_bytes

SUFFIXES = {"text": (".txt", ".md", ".text"), "jsonl": (".jsonl",), "chat": (".jsonl",)}
ROLES = ("system", "user", "assistant")


class DataError(ValueError):
    """Unusable training data; ``str(err)`` is one line naming the file and line."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Document:
    """One document: ``text`` (text/jsonl) or ``messages`` (chat), and where it came from."""

    source: str
    line: int
    text: str = ""
    messages: tuple[dict[str, str], ...] = ()


@dataclass(kw_only=True, slots=True)
class ReadResult:
    documents: list[Document] = field(default_factory=list)
    bad_records: int = 0
    files: list[str] = field(default_factory=list)
    fingerprint: list[list[Any]] = field(default_factory=list)
    """(uri, size, mtime) of every file read: part of the node-local cache key."""


class _Reader:
    def __init__(self, on_bad_record: str):
        self.skip = on_bad_record == "skip"
        self.result = ReadResult()

    def bad(self, source: str, line: int, problem: str) -> None:
        if not self.skip:
            raise DataError(f"{source}, line {line}: {problem}")
        self.result.bad_records += 1


def _text_documents(reader: _Reader, source: str, text: str) -> None:
    block: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines() + [""], 1):
        if line.strip():
            if not block:
                start = number
            block.append(line)
        elif block:
            reader.result.documents.append(Document(source=source, line=start, text="\n".join(block)))
            block = []


_ARRAY_HINT = "the file is one JSON array, not JSON Lines: write one object per line (e.g. jq -c '.[]')"
_SHAREGPT_HINT = ("ShareGPT turns ({'from', 'value'}): convert to {\"messages\": [{\"role\": "
                  "\"user\"|\"assistant\"|\"system\", \"content\": \"...\"}]}")


def _found(record: dict) -> str:
    """``; found: a, b`` (the record's own keys), to show a wrong field name next to the right one."""
    keys = ", ".join(sorted(map(str, record))[:6])
    return f"; found: {keys}" if keys else "; the object is empty"


def _check_messages(value: Any) -> str | None:
    """The problem with a ``messages`` value, or None if it is a trainable chat."""
    if not isinstance(value, list):
        return f"field 'messages' must be a list of messages, got {type(value).__name__}"
    if not value:
        return "field 'messages' is an empty list (a chat needs at least one message)"
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            return f"messages[{i}] must be an object with 'role' and 'content', got {type(m).__name__}"
        role, content = m.get("role"), m.get("content")
        if role is None and "from" in m:
            return f"messages[{i}] has no 'role' but 'from': {_SHAREGPT_HINT}"
        if role not in ROLES:
            return f"messages[{i}].role is {role!r}; allowed: {', '.join(ROLES)}"
        if not isinstance(content, str):
            return f"messages[{i}].content must be a string, got {type(content).__name__}"
    roles = [m["role"] for m in value]
    if "assistant" not in roles:
        return "no assistant message (nothing to train on)"
    if "user" not in roles[:roles.index("assistant")]:
        return "the first assistant message must follow a user message"
    if not any(m["role"] == "assistant" and m["content"].strip() for m in value):
        return "every assistant message is empty (nothing to train on)"
    return None


def _jsonl_documents(reader: _Reader, source: str, raw: bytes, kind: str) -> None:
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
            hint = f"; {_ARRAY_HINT}" if array_start else ""
            reader.bad(source, number, f"not valid JSON ({err.msg} at column {err.colno}){hint}")
            continue
        if not isinstance(record, dict):
            hint = f"; {_ARRAY_HINT}" if array_start and isinstance(record, list) and len(record) > 1 else ""
            reader.bad(source, number, f"expected a JSON object, got {type(record).__name__}{hint}")
            continue
        if kind == "jsonl":
            if "text" not in record:
                hint = " (chat records: set data.kind = 'chat')" if "messages" in record else ""
                reader.bad(source, number, f"missing field 'text' (expected {{\"text\": \"...\"}}{_found(record)}){hint}")
            elif not isinstance(record["text"], str):
                reader.bad(source, number, f"field 'text' must be a string, got {type(record['text']).__name__}")
            elif not record["text"].strip():
                reader.bad(source, number, "field 'text' is empty")
            else:
                reader.result.documents.append(Document(source=source, line=number, text=record["text"]))
            continue
        if "messages" not in record:
            hint = f": {_SHAREGPT_HINT}" if "conversations" in record else ""
            reader.bad(source, number, "missing field 'messages' (expected {\"messages\": [{\"role\", \"content\"}, ...]}"
                       f"{_found(record)}){hint}")
            continue
        problem = _check_messages(record["messages"])
        if problem:
            reader.bad(source, number, problem)
            continue
        messages = tuple({"role": m["role"], "content": m["content"]} for m in record["messages"])
        reader.result.documents.append(Document(source=source, line=number, messages=messages))


def parse_file(reader: _Reader, source: str, raw: bytes, kind: str) -> None:
    """The documents of one file's bytes, by data kind: THE parser the job and the data check
    share (a new kind is a branch here and its suffixes in :data:`SUFFIXES`)."""
    if kind == "text":
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            reader.bad(source, raw[:err.start].count(b"\n") + 1, "not valid UTF-8")
            text = raw.decode("utf-8", errors="replace")
        _text_documents(reader, source, text)
    else:
        _jsonl_documents(reader, source, raw, kind)


def read_documents(path: str, kind: str, *, on_bad_record: str = "error") -> ReadResult:
    """Every document under ``path`` (file, directory or ``s3://`` prefix), in file and line order."""
    if kind not in SUFFIXES:
        raise DataError(f"{path}: data kind {kind!r} has no reader (allowed: {', '.join(SUFFIXES)})")
    reader = _Reader(on_bad_record)
    try:
        files = list_files(path, SUFFIXES[kind])
    except FileNotFoundError as err:
        raise DataError(f"{err} (data.kind {kind!r} reads {'/'.join(SUFFIXES[kind])})") from None
    for f in files:
        reader.result.files.append(f.uri)
        reader.result.fingerprint.append([f.uri, f.size, f.mtime])
        raw = read_bytes(f.uri)
        if not raw.strip():
            reader.bad(f.uri, 1, "empty file")
            continue
        parse_file(reader, f.uri, raw, kind)
    if not reader.result.documents:
        raise DataError(f"{path}: no usable {kind} documents "
                        f"({reader.result.bad_records} bad records skipped in {len(files)} files)")
    return reader.result
