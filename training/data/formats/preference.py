"""``preference``: JSON Lines of preference pairs as TRL defines them (TRL 1.16.0 docs
"Dataset formats": *preference*, explicit prompt): ``{"prompt", "chosen", "rejected"}``, either

- plain text: three strings (the completions follow the prompt as written; the tokenizer's end
  of sequence is appended to each completion, as TRL's ``DPOTrainer._prepare_dataset`` does), or
- conversational: ``prompt`` a list of ``{"role", "content"}`` messages ending with a user turn,
  ``chosen`` and ``rejected`` lists of assistant messages; rendered with the model's chat template.

Trained with ``train.objective = "dpo"`` (training/objectives/dpo.py): the pair becomes two
sequences, prompt + chosen and prompt + rejected, tokenized by TRL's rule
(training/data/tokenizer.py ``tokenize_pair``), packed side by side in one row. A Hugging Face
dataset with ``prompt``, ``chosen`` and ``rejected`` columns is read by ``hf`` through this
file's record converter. TRL's implicit-prompt form (no ``prompt``: the shared start of chosen
and rejected) is refused with a hint: the prompt would have to be guessed.
"""
from __future__ import annotations

from typing import Any

from training.data.formats.chat import conversation
from training.data.records import BadRecord, found, record_format, shown

FIELDS = ("prompt", "chosen", "rejected")


def _messages(record: dict, name: str, roles: tuple[str, ...]) -> tuple[dict[str, str], ...]:
    value = record[name]
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in roles:
            raise BadRecord(f"{name}[{i}] must be {{'role': {' | '.join(roles)}, 'content': str}}, got {shown(m)}")
    if not value:
        raise BadRecord(f"field {name!r} is an empty list")
    return tuple({"role": m["role"], "content": m["content"]} for m in value)


def preference_record(record: dict) -> dict[str, Any]:
    """``{"prompt", "chosen", "rejected"}`` -> a pair document."""
    missing = [name for name in FIELDS if name not in record]
    if missing:
        hint = (" (TRL's implicit-prompt form: give the shared start as 'prompt' and the rest as chosen/rejected)"
                if "prompt" in missing and "chosen" in record else "")
        raise BadRecord(f"missing field {missing[0]!r} (expected {{\"prompt\", \"chosen\", \"rejected\"}}{found(record)}){hint}")
    kinds = {name: type(record[name]).__name__ for name in FIELDS}
    if all(isinstance(record[name], str) for name in FIELDS):
        for name in FIELDS:
            if not record[name].strip():
                raise BadRecord(f"field {name!r} is empty")
        if record["chosen"] == record["rejected"]:
            raise BadRecord("chosen and rejected are the same text (the pair prefers nothing)")
        return {"pair": (record["prompt"], record["chosen"], record["rejected"])}
    if all(isinstance(record[name], list) for name in FIELDS):
        prompt = conversation(record["prompt"] + [{"role": "assistant", "content": "-"}], "prompt")[:-1]
        if prompt[-1]["role"] != "user":
            raise BadRecord(f"prompt must end with a user message, ends with {prompt[-1]['role']!r}")
        chosen, rejected = _messages(record, "chosen", ("assistant",)), _messages(record, "rejected", ("assistant",))
        if chosen == rejected:
            raise BadRecord("chosen and rejected are the same messages (the pair prefers nothing)")
        return {"pair": (prompt, chosen, rejected)}
    raise BadRecord(f"prompt, chosen and rejected must be all strings (plain text) or all lists of messages "
                    f"(conversational), got {', '.join(f'{k}: {v}' for k, v in kinds.items())}")


FORMAT = record_format(summary='{"prompt", "chosen", "rejected"} (strings, or lists of {"role", "content"})',
                       record=preference_record, columns=FIELDS, conversations=False)
