"""``sharegpt``: ``{"conversations": [{"from", "value"}, ...]}`` records (ShareGPT, as FastChat
and most SFT sets write them), as JSON Lines or one JSON array per ``.json`` file.

Speakers map to chat roles by :data:`SPEAKERS` (``human``/``gpt`` and their common spellings);
any other speaker (``function_call``, ``observation``, ...) is a bad record naming it. Then the
chat rules apply (training/data/formats/chat.py: an assistant turn after a user turn).
"""
from __future__ import annotations

from training.data.formats.chat import conversation
from training.data.records import BadRecord, found, record_format, shown

SPEAKERS = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
            "bard": "assistant", "bing": "assistant", "system": "system"}


def sharegpt_record(record: dict) -> dict:
    """``{"conversations": [{"from", "value"}]}`` -> a conversation."""
    if "conversations" not in record:
        raise BadRecord(f"missing field 'conversations' (expected {{\"conversations\": [{{\"from\", \"value\"}}, ...]}}"
                        f"{found(record)})")
    turns = record["conversations"]
    if not isinstance(turns, list):
        raise BadRecord(f"field 'conversations' must be a list of turns, got {type(turns).__name__} ({shown(turns)})")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            raise BadRecord(f"conversations[{i}] must be an object with 'from' and 'value', got {shown(turn)}")
        speaker = turn["from"]
        if speaker not in SPEAKERS:
            raise BadRecord(f"conversations[{i}].from is {shown(speaker)}; allowed: {', '.join(SPEAKERS)}")
        messages.append({"role": SPEAKERS[speaker], "content": turn["value"]})
    return {"messages": conversation(messages, "conversations")}


FORMAT = record_format(summary='{"conversations": [{"from", "value"}, ...]}', record=sharegpt_record,
                       columns=("conversations",), conversations=True, arrays=True)
