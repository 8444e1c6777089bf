"""``alpaca``: instruction tuning records ``{"instruction", "input", "output"}`` (Stanford
Alpaca's ``alpaca_data.json``), as JSON Lines or one JSON array per ``.json`` file.

A record becomes a conversation: the user says the instruction, followed by the input after a
blank line when there is one; the assistant answers the output (trained on the output only, as
every conversation). An optional ``system`` string becomes the system turn. An optional
``history``, a list of ``[instruction, response]`` pairs (LLaMA-Factory's alpaca format:
data/README.md "Alpaca Format"; ``AlpacaDatasetConverter`` in src/llamafactory/data/converter.py
adds each pair as a user and an assistant turn before the instruction), becomes the earlier
turns, trained on as every assistant turn.

Deliberate: the conversation is rendered by the tokenizer's chat template
(training/data/tokenizer.py), not by Stanford Alpaca's ``PROMPT_DICT`` ("Below is an instruction
that describes a task..."; tatsu-lab/stanford_alpaca train.py): the model is then trained in the
format it is prompted with at inference, and one corpus may mix alpaca and chat records.
"""
from __future__ import annotations

from training.data.records import BadRecord, record_format, shown, string_field


def _history(record: dict) -> tuple[dict[str, str], ...]:
    pairs = record.get("history")
    if pairs is None:
        return ()
    if not isinstance(pairs, list):
        raise BadRecord(f"field 'history' must be a list of [instruction, response] pairs, got "
                        f"{type(pairs).__name__} ({shown(pairs)})")
    turns = []
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
            raise BadRecord(f"history[{i}] must be an [instruction, response] pair of strings, got {shown(pair)}")
        turns += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    return tuple(turns)


def alpaca_record(record: dict) -> dict:
    """``{"instruction", "input"?, "output", "system"?, "history"?}`` -> a conversation."""
    instruction = string_field(record, "instruction")
    extra = string_field(record, "input", required=False)
    output = string_field(record, "output")
    system = string_field(record, "system", required=False)
    user = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    turns = ({"role": "system", "content": system},) if system.strip() else ()
    return {"messages": turns + _history(record) + ({"role": "user", "content": user},
                                                     {"role": "assistant", "content": output})}


FORMAT = record_format(summary='{"instruction", "input", "output"}', record=alpaca_record,
                       columns=("instruction", "output"), conversations=True, arrays=True)
