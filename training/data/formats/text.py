"""``text``: plain-text files (``.txt``, ``.md``, ``.text``); a document is a run of non-blank
lines, documents are separated by one or more blank lines.

Invalid UTF-8 is counted once per file under ``on_bad_record = "skip"`` and decoded with U+FFFD
replacement characters, since a text file has no record boundary to skip to.
"""
from __future__ import annotations

from training.data.records import DataFormat, Document, Reader, bytes_format


def _parse(reader: Reader, source: str, raw: bytes, complete: bool) -> None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        reader.bad(source, raw[:err.start].count(b"\n") + 1, "not valid UTF-8")
        text = raw.decode("utf-8", errors="replace")
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


FORMAT = DataFormat(summary="plain text, documents separated by blank lines", suffixes=(".txt", ".md", ".text"),
                    read=bytes_format(_parse))
