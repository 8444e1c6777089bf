"""``sharegpt``: ``{"conversations": [{"from", "value"}, ...], "system"?}`` records (ShareGPT, as
FastChat, LLaMA-Factory and most SFT sets write them), as JSON Lines or one JSON array per ``.json``
file.

Speakers map to chat roles by :data:`SPEAKERS` (``human``/``gpt`` and their common spellings).
As LLaMA-Factory's ``SharegptDatasetConverter`` (src/llamafactory/data/converter.py), a
``system`` field is the system turn when the conversation does not open with one. As FastChat's
``preprocess`` (fastchat/train/train.py: ``if roles[source[0]["from"]] != conv.roles[0]: source =
source[1:]``), assistant turns before the first human turn are dropped, counted in
:attr:`~training.data.records.ReadResult.dropped_turns`. Tool turns (LLaMA-Factory's
``function_call``/``observation``, ``tool``) are refused by name: training renders conversations
with the tokenizer's chat template from system/user/assistant turns only
(training/data/tokenizer.py), and a tool call flattened into an assistant's text would teach a
format the template does not produce. Then the chat rules apply (training/data/formats/chat.py).
"""
from __future__ import annotations

from training.data.formats.chat import ROLES, conversation
from training.data.records import BadRecord, found, record_format, shown, string_field

SPEAKERS = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
            "bard": "assistant", "bing": "assistant", "system": "system"}
TOOL_SPEAKERS = ("function_call", "observation", "tool", "function")
"""LLaMA-Factory's ``function_tag``/``observation_tag`` defaults and OpenAI-style tool roles."""


def _speaker(i: int, speaker) -> str:
    if speaker in TOOL_SPEAKERS:
        raise BadRecord(f"conversations[{i}].from is {shown(speaker)}: tool turns are not supported (the chat "
                        f"template is given {', '.join(ROLES)} turns only); allowed: {', '.join(SPEAKERS)}")
    if speaker not in SPEAKERS:
        raise BadRecord(f"conversations[{i}].from is {shown(speaker)}; allowed: {', '.join(SPEAKERS)}")
    return SPEAKERS[speaker]


def sharegpt_record(record: dict) -> dict:
    """``{"conversations": [{"from", "value"}], "system"?}`` -> a conversation (and the leading
    assistant turns dropped)."""
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
        messages.append({"role": _speaker(i, turn["from"]), "content": turn["value"]})
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    rest = messages[len(system):]
    dropped = next((n for n, m in enumerate(rest) if m["role"] != "assistant"), 0)  # all assistant: refused below
    if not system and string_field(record, "system", required=False).strip():
        system = [{"role": "system", "content": record["system"]}]
    return {"messages": conversation(system + rest[dropped:], "conversations"), "dropped_turns": dropped}


FORMAT = record_format(summary='{"conversations": [{"from", "value"}, ...]}', record=sharegpt_record,
                       columns=("conversations",), conversations=True, arrays=True)
