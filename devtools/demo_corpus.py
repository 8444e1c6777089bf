"""Generate the demo corpus, training/assets/demo_corpus/ (deterministic; standard library only).

    python -m devtools.demo_corpus [OUT_DIR]   (default: training/assets/demo_corpus)

A developer's tool, not part of the job: the job reads the files it wrote, which ship as package
data.

Every sentence is produced by the templates below, written for this project: no third-party
text, so the corpus carries the project's own licence (see README.md). Output:

- ``text/notes.txt``: short plain-text documents separated by blank lines (data.kind = "text")
- ``jsonl/notes.jsonl``: the same documents as ``{"text": ...}`` lines (data.kind = "jsonl")
- ``chat/arithmetic.jsonl``: ``{"messages": [...]}`` prompt/answer chats with checkable answers
  (sums, differences, products, unit conversions; some with two turns) (data.kind = "chat")
- ``preference/pairs.jsonl``: ``{"prompt", "chosen", "rejected"}`` plain-text pairs, the chosen
  answer the exact one in a fixed phrasing, the rejected one evasive (data.kind = "preference")
- ``../benchmarks/tiny-arith.jsonl`` (multiple choice: ``{"question", "choices", "answer"}``) and
  ``../benchmarks/tiny-arith-gen.jsonl`` (generation: ``{"question", "answer"}``): the tiny
  benchmark tasks ``eval.benchmarks`` names
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "training" / "assets" / "demo_corpus"
"""Where the corpus lives (the benchmarks beside it, in ``../benchmarks``)."""
SEED = 20261130
TEXT_DOCS = 660
CHATS = 1100
PAIRS = 240
BENCHMARK_QUESTIONS = 40
EVASIVE = ["I would rather not say.", "That is hard to tell.", "Ask someone else.", "No idea, sorry.",
           "I cannot work that out."]

TOWNS = ["Alder Bay", "Millford", "Rookstone", "Elm Cross", "Haverly", "Stonemoor", "Wickham Vale", "Brightwater"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
SKIES = ["light rain", "clear skies", "low cloud", "fog", "a few showers", "bright sunshine", "strong gusts"]
WINDS = ["north", "north-east", "east", "south-east", "south", "south-west", "west", "north-west"]
TOOLS = ["hammers", "saws", "ladders", "spades", "lanterns", "ropes", "buckets", "chisels"]
PLANTS = ["tomatoes", "beans", "carrots", "lettuces", "onions", "pumpkins", "peas", "radishes"]
UNITS = [  # (from, to, factor, noun-from, noun-to)
    ("km", "m", 1000, "kilometres", "metres"), ("m", "cm", 100, "metres", "centimetres"),
    ("kg", "g", 1000, "kilograms", "grams"), ("h", "min", 60, "hours", "minutes"),
    ("L", "mL", 1000, "litres", "millilitres"), ("min", "s", 60, "minutes", "seconds"),
]


def weather(r: random.Random) -> str:
    lo = r.randint(-2, 15)
    hi = lo + r.randint(2, 10)
    return (f"On {r.choice(DAYS)} the town of {r.choice(TOWNS)} had {r.choice(SKIES)} in the morning. "
            f"The temperature rose from {lo} to {hi} degrees Celsius, a change of {hi - lo} degrees. "
            f"Wind came from the {r.choice(WINDS)} at {r.randint(5, 60)} kilometres per hour.")


def workshop(r: random.Random) -> str:
    a, b = r.sample(TOOLS, 2)
    na, nb = r.randint(3, 40), r.randint(3, 40)
    sent = r.randint(1, na - 1) if na > 1 else 0
    return (f"The workshop in {r.choice(TOWNS)} counted {na} {a} and {nb} {b}. "
            f"Of the {a}, {sent} went away for repair, so {na - sent} remain in use. "
            f"Altogether the shelves now hold {na - sent + nb} tools.")


def timetable(r: random.Random) -> str:
    start, stop, end = r.sample(TOWNS, 3)
    hour, minute = r.randint(5, 20), r.choice([0, 5, 15, 20, 30, 40, 45, 50])
    travel = r.randint(20, 150)
    arrive = hour * 60 + minute + travel
    return (f"The {hour:02d}:{minute:02d} train from {start} to {end} stops at {stop}. "
            f"The journey takes {travel} minutes, so it arrives at {arrive // 60 % 24:02d}:{arrive % 60:02d}. "
            f"Passengers for {stop} should sit in the front carriages.")


def garden(r: random.Random) -> str:
    p = r.choice(PLANTS)
    rows, per = r.randint(2, 9), r.randint(3, 12)
    return (f"In the garden we planted {rows} rows of {p} with {per} plants in each row. "
            f"That makes {rows * per} plants. The {p} need water every {r.randint(2, 4)} days "
            f"and should be ready in about {r.randint(6, 16)} weeks.")


def arithmetic_note(r: random.Random) -> str:
    a, b = r.randint(11, 99), r.randint(11, 99)
    ta, tb = a // 10 * 10, b // 10 * 10
    return (f"To add {a} and {b}, first add the tens: {ta} plus {tb} is {ta + tb}. "
            f"Then add the units: {a % 10} plus {b % 10} is {a % 10 + b % 10}. "
            f"Together that gives {a + b}.")


def conversion_note(r: random.Random) -> str:
    _, _, f, nf, nt = r.choice(UNITS)
    n = r.randint(2, 30)
    return f"One of the {nf} is {f} {nt}. So {n} {nf} are {n} times {f}, which is {n * f} {nt}."


def chat(r: random.Random) -> tuple[str, str]:
    kind = r.randrange(4)
    if kind == 0:
        a, b = r.randint(2, 499), r.randint(2, 499)
        q = r.choice(["What is {a} + {b}?", "Add {a} and {b}.", "Compute {a} plus {b}."]).format(a=a, b=b)
        return q, str(a + b)
    if kind == 1:
        a, b = sorted((r.randint(2, 499), r.randint(2, 499)), reverse=True)
        q = r.choice(["What is {a} - {b}?", "Subtract {b} from {a}.", "Compute {a} minus {b}."]).format(a=a, b=b)
        return q, str(a - b)
    if kind == 2:
        a, b = r.randint(2, 30), r.randint(2, 12)
        q = r.choice(["What is {a} * {b}?", "Multiply {a} by {b}.", "Compute {a} times {b}."]).format(a=a, b=b)
        return q, str(a * b)
    u_from, u_to, f, nf, nt = r.choice(UNITS)
    n = r.randint(1, 50)
    q = r.choice(["Convert {n} {uf} to {ut}.", "How many {nt} are in {n} {nf}?"]).format(
        n=n, uf=u_from, ut=u_to, nt=nt, nf=nf)
    return q, f"{n * f} {u_to}"


def main(out: Path = HERE) -> None:
    r = random.Random(SEED)
    makers = [weather, workshop, timetable, garden, arithmetic_note, conversion_note]
    docs = [makers[i % len(makers)](r) for i in range(TEXT_DOCS)]
    for sub in ("text", "jsonl", "chat"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    (out / "text" / "notes.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    (out / "jsonl" / "notes.jsonl").write_text(
        "".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    lines = []
    for _ in range(CHATS):
        turns = 2 if r.random() < 0.1 else 1
        messages = []
        for _ in range(turns):
            q, a = chat(r)
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        lines.append(json.dumps({"messages": messages}) + "\n")
    (out / "chat" / "arithmetic.jsonl").write_text("".join(lines), encoding="utf-8")
    preference_and_benchmarks(out)


def preference_and_benchmarks(out: Path) -> None:
    """The DPO pairs and the benchmark tasks, from their own generator (the files above stay as they were)."""
    r = random.Random(SEED + 1)
    pairs = []
    for _ in range(PAIRS):
        q, a = chat(r)
        pairs.append(json.dumps({"prompt": f"Question: {q}\nAnswer:", "chosen": f" The answer is {a}.",
                                 "rejected": f" {r.choice(EVASIVE)}"}) + "\n")
    (out / "preference").mkdir(parents=True, exist_ok=True)
    (out / "preference" / "pairs.jsonl").write_text("".join(pairs), encoding="utf-8")
    bench = out.parent / "benchmarks"
    bench.mkdir(parents=True, exist_ok=True)
    choice_lines, gen_lines = [], []
    for _ in range(BENCHMARK_QUESTIONS):
        a, b = r.randint(2, 20), r.randint(2, 20)
        right = a + b
        wrong = sorted({right + d for d in (-10, -2, -1, 1, 2, 10) if right + d > 0} - {right})
        choices = r.sample(wrong, 3) + [right]
        r.shuffle(choices)
        choice_lines.append(json.dumps({"question": f"What is {a} + {b}?", "choices": [str(c) for c in choices],
                                        "answer": choices.index(right)}) + "\n")
        q, ans = chat(r)
        gen_lines.append(json.dumps({"question": q, "answer": ans}) + "\n")
    (bench / "tiny-arith.jsonl").write_text("".join(choice_lines), encoding="utf-8")
    (bench / "tiny-arith-gen.jsonl").write_text("".join(gen_lines), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
