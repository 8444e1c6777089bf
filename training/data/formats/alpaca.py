"""``alpaca``: instruction tuning records ``{"instruction", "input", "output"}`` (Stanford
Alpaca's ``alpaca_data.json``), as JSON Lines or one JSON array per ``.json`` file.

A record becomes a two-turn conversation: the user says the instruction, followed by the input
after a blank line when there is one; the assistant answers the output (trained on the output
only, as every conversation). An optional ``system`` string becomes the system turn.
"""
from __future__ import annotations

from training.data.records import record_format, string_field


def alpaca_record(record: dict) -> dict:
    """``{"instruction", "input"?, "output", "system"?}`` -> a conversation."""
    instruction = string_field(record, "instruction")
    extra = string_field(record, "input", required=False)
    output = string_field(record, "output")
    system = string_field(record, "system", required=False)
    user = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    turns = ({"role": "system", "content": system},) if system.strip() else ()
    return {"messages": turns + ({"role": "user", "content": user}, {"role": "assistant", "content": output})}


FORMAT = record_format(summary='{"instruction", "input", "output"}', record=alpaca_record,
                       columns=("instruction", "output"), conversations=True, arrays=True)
