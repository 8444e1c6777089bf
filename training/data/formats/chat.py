"""``chat``: JSON Lines of ``{"messages": [{"role", "content"}, ...]}``, roles ``system``/``user``/
``assistant``, at least one assistant message after a user message. Trained on the assistant
turns only (training/data/tokenizer.py). :func:`conversation` is the rule every conversation
format ends in (alpaca, sharegpt)."""
from __future__ import annotations

from typing import Any

from training.data.records import BadRecord, found, record_format, shown

ROLES = ("system", "user", "assistant")
SHAREGPT_HINT = "ShareGPT turns ({'from', 'value'}): set data.kind = 'sharegpt'"
SHAREGPT_TURNS_HINT = ("ShareGPT turns ({'from', 'value'}) are read from a 'conversations' field (data.kind "
                       "'sharegpt'; in an hf dataset, a column named 'conversations')")


def conversation(value: Any, name: str = "messages") -> tuple[dict[str, str], ...]:
    """A trainable conversation from a list of ``{"role", "content"}``, else :class:`BadRecord`."""
    if not isinstance(value, list):
        raise BadRecord(f"field {name!r} must be a list of messages, got {type(value).__name__} ({shown(value)})")
    if not value:
        raise BadRecord(f"field {name!r} is an empty list (a chat needs at least one message)")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise BadRecord(f"{name}[{i}] must be an object with 'role' and 'content', got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if role is None and "from" in m:
            raise BadRecord(f"{name}[{i}] has no 'role' but 'from': {SHAREGPT_TURNS_HINT}")
        if role not in ROLES:
            raise BadRecord(f"{name}[{i}].role is {role!r}; allowed: {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise BadRecord(f"{name}[{i}].content must be a string, got {type(content).__name__} ({shown(content)})")
    roles = [m["role"] for m in value]
    if "assistant" not in roles:
        raise BadRecord("no assistant message (nothing to train on)")
    if "user" not in roles[:roles.index("assistant")]:
        raise BadRecord("the first assistant message must follow a user message")
    if not any(m["role"] == "assistant" and m["content"].strip() for m in value):
        raise BadRecord("every assistant message is empty (nothing to train on)")
    return tuple({"role": m["role"], "content": m["content"]} for m in value)


def chat_record(record: dict) -> dict:
    """``{"messages"}`` -> a conversation."""
    if "messages" not in record:
        hint = f": {SHAREGPT_HINT}" if "conversations" in record else ""
        raise BadRecord("missing field 'messages' (expected {\"messages\": [{\"role\", \"content\"}, ...]}"
                        f"{found(record)}){hint}")
    return {"messages": conversation(record["messages"])}


FORMAT = record_format(summary='{"messages": [{"role", "content"}, ...]}', record=chat_record,
                       columns=("messages",), conversations=True)
