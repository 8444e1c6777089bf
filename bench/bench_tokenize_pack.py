"""Tokenize + pack throughput on 2 cores with the real Qwen2.5 tokenizer, on the demo corpus.

    python bench/bench_tokenize_pack.py [--repeats 3] [--seq-len 256]

Measures the work ``build_data`` does once per node (read, split, tokenize, chat rendering
and masking, packing), with the node-local cache bypassed, for the text and the chat demo
corpus. Tokenizer threads are limited to 2 (RAYON_NUM_THREADS), the size of these machines.
Prints ONE JSON object on the last line: tokens/s per kind (best of the repeats).
Builds the tokenizer into training/assets/qwen2.5-tokenizer first if it is missing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "2")  # must precede the tokenizers import
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=256)
    args = parser.parse_args()

    from devtools.tokenizer_build import DEFAULT_OUT, build
    from training.config import job_config_from_dict
    from training.data.build import build_packed
    from training.data.tokenizer import document_separator_id, load_tokenizer

    tok_dir = build(ROOT / DEFAULT_OUT)
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(tok_dir)
    load_s = time.perf_counter() - t0
    sep = document_separator_id(tokenizer)
    figures: dict = {"name": "tokenize_pack", "seq_len": args.seq_len, "threads": os.environ["RAYON_NUM_THREADS"],
                     "tokenizer_load_s": round(load_s, 2)}
    for kind in ("text", "chat"):
        cfg = job_config_from_dict({
            "name": "bench", "model": {"config": {"hidden_size": 64}},
            "data": {"kind": kind, "path": str(ROOT / "training/assets/demo_corpus" / kind)},
            "train": {"seq_len": args.seq_len, "micro_batch_size": 1, "global_batch_size": 1, "max_steps": 2,
                      "warmup_steps": 1},
        }, "bench")
        best, tokens, docs = float("inf"), 0, 0
        for _ in range(args.repeats):
            start = time.perf_counter()
            arrays, meta = build_packed(cfg, tokenizer, sep)
            best = min(best, time.perf_counter() - start)
            stats = meta["stats"]
            tokens = stats["tokens"] + stats["tokens_dropped"] + arrays["eval_ids"].size
            docs = stats["documents"]
        figures[f"{kind}_tokens"] = int(tokens)
        figures[f"{kind}_documents"] = docs
        figures[f"{kind}_seconds"] = round(best, 3)
        figures[f"{kind}_tokens_per_s"] = round(tokens / best)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
