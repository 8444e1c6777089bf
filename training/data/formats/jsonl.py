"""``jsonl``: JSON Lines of ``{"text": "..."}``; every token is trained on."""
from __future__ import annotations

from training.data.records import BadRecord, found, record_format, string_field


def text_record(record: dict) -> dict:
    """``{"text"}`` -> a text document."""
    if "text" not in record:
        hint = " (chat records: set data.kind = 'chat')" if "messages" in record else ""
        raise BadRecord(f"missing field 'text' (expected {{\"text\": \"...\"}}{found(record)}){hint}")
    return {"text": string_field(record, "text")}


FORMAT = record_format(summary='{"text": "..."}', record=text_record, columns=("text",), conversations=False)
