"""The oracle for the job's benchmark evaluation (training/evaluation.py ``benchmark``):
lm-evaluation-harness 0.4.13 itself (a test-only dependency; the DLC has none), its ``hf``
model (HFLM) on the same tiny saved model, the same tokenizer and the same task file.

The task is declared to lm_eval as the job reads it: ``doc_to_text`` "Question: {{question}}\\nAnswer:",
``doc_to_choice`` the choices, ``doc_to_target`` the answer's index, ``target_delimiter`` " ",
metrics acc and acc_norm (multiple choice); a generative task with ``until ["\\n"]``, greedy, a
``remove_whitespace`` filter and exact_match. Same model, same questions: every choice's
log-likelihood, acc, acc_norm and exact_match must be lm_eval's. A broken scorer (acc_norm by
token count instead of characters; the choice without its leading space) must fail.
"""
from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from tiny_qwen import tiny_qwen2_config

if importlib.util.find_spec("lm_eval") is None:  # the dev extra pins it (pyproject.toml)
    pytest.skip("lm_eval is not installed: the dev extra pins it", allow_module_level=True)
# lm_eval is imported by the tests that run it, not here: every pytest-xdist worker collects this
# module and one runs it (lm_eval imports datasets: seconds)
# lm_eval starts processes of its own (git, for the version it records): the subprocess tier
pytestmark = pytest.mark.subprocess

TOKENIZER = "training/assets/qwen2.5-tokenizer"
MC_TASK = "training/assets/benchmarks/tiny-arith.jsonl"
GEN_TASK = "training/assets/benchmarks/tiny-arith-gen.jsonl"
QUESTIONS = 10
WORDS = ["ox", "hippopotamus", "cat", "elephant", "antidisestablishmentarianism", "a b c d", "zzzz", "Mississippi",
         "internationalization", "go", "photosynthesis", "yes"]


@pytest.fixture(scope="module")
def word_task(tmp_path_factory):
    """Choices whose characters per token differ (the tiny-arith numbers are one digit a token:
    there acc_norm by characters and by tokens agree)."""
    import random

    r = random.Random(5)
    path = tmp_path_factory.mktemp("words") / "tiny-words.jsonl"
    path.write_text("".join(json.dumps({"question": f"Which word is number {i}?", "choices": r.sample(WORDS, 4),
                                        "answer": r.randrange(4)}) + "\n" for i in range(QUESTIONS)))
    return str(path)

MC_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
target_delimiter: " "
metric_list:
  - metric: acc
  - metric: acc_norm
"""
GEN_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: answer
generation_kwargs:
  until: ["\\n"]
  do_sample: false
  max_gen_toks: 16
filter_list:
  - name: strip
    filter:
      - function: remove_whitespace
      - function: take_first
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**tiny_qwen2_config(
        vocab_size=151936, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
        max_position_embeddings=512)), dtype=torch.float32)
    folder = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(folder)
    return folder


_ORACLE: dict[tuple[str, str, str], tuple[list, dict]] = {}


def _lm_eval(folder, yaml_text, path, tmp_path):
    """lm_eval's per-document records and aggregate scores, run once per model, task and task
    file: the word task's three tests (ours right, and the two broken scorers that must fail)
    compare against the same answer, which lm_eval computed once."""
    key = (str(folder), yaml_text, str(path))
    if key not in _ORACLE:
        _ORACLE[key] = _run_lm_eval(folder, yaml_text, path, tmp_path)
    return _ORACLE[key]


def _run_lm_eval(folder, yaml_text, path, tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    subset = tmp_path / "task.jsonl"
    subset.write_text("".join(open(path).readlines()[:QUESTIONS]))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "oracle.yaml").write_text(yaml_text.format(name="oracle", path=subset))
    # include_defaults=False: the task is this file alone; lm_eval's ~14,000 built-in task files
    # are not indexed (seconds per TaskManager), none of them is read by it
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    out = simple_evaluate(model="hf", model_args=f"pretrained={folder},tokenizer={os.path.abspath(TOKENIZER)},dtype=float32",
                          tasks=["oracle"], task_manager=TaskManager(include_path=str(tasks), include_defaults=False), device="cpu",
                          batch_size=1, log_samples=True)
    return sorted(out["samples"]["oracle"], key=lambda s: s["doc_id"]), out["results"]["oracle"]


def _ours(folder, task):
    from transformers import AutoModelForCausalLM

    from training import evaluation
    from training.model import use_chunked_loss_head, use_packed_attention
    from training.data.tokenizer import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    use_packed_attention(model)  # as the job builds it (training/model.py build_model)
    use_chunked_loss_head(model)
    tokenizer = load_tokenizer(TOKENIZER)
    _, questions = evaluation.read_task(task)
    return model, tokenizer, questions[:QUESTIONS]


def _compare_choices(folder, tmp_path, task=MC_TASK, *, ll=None, score=None):
    from pathlib import Path

    from training import evaluation

    samples, results = _lm_eval(folder, MC_YAML, task, tmp_path)
    model, tokenizer, questions = _ours(folder, task)
    ll = ll or evaluation.choice_loglikelihoods
    score = score or evaluation.score_choices
    accs = []
    for q, sample in zip(questions, samples, strict=True):
        with torch.no_grad():
            lls = ll(model, tokenizer, q, torch.device("cpu"))
        theirs = [float(r[0]) for r in sample["filtered_resps"]]
        assert lls == pytest.approx(theirs, rel=1e-4, abs=1e-4), f"doc {sample['doc_id']}: {lls} vs lm_eval {theirs}"
        acc, acc_norm = score(lls, q)
        assert (acc, acc_norm) == (sample["acc"], sample["acc_norm"]), f"doc {sample['doc_id']}"
        accs.append((acc, acc_norm))
    with torch.no_grad():
        ours = evaluation.benchmark(model, tokenizer, [task], device=torch.device("cpu"), max_questions=QUESTIONS)
    assert ours["tasks"][Path(task).stem]["acc"] == pytest.approx(results["acc,none"])
    assert ours["tasks"][Path(task).stem]["acc_norm"] == pytest.approx(results["acc_norm,none"])
    return accs


@pytest.mark.parametrize("task", ["tiny-arith", "words"])
def test_multiple_choice_matches_lm_eval(task, saved_model, word_task, tmp_path, one_rank_group):
    _compare_choices(saved_model, tmp_path, MC_TASK if task == "tiny-arith" else word_task)


def test_generative_exact_match_matches_lm_eval(saved_model, tmp_path, one_rank_group):
    from training import evaluation

    samples, results = _lm_eval(saved_model, GEN_YAML, GEN_TASK, tmp_path)
    model, tokenizer, questions = _ours(saved_model, GEN_TASK)
    with torch.no_grad():
        for q, sample in zip(questions, samples, strict=True):
            text = evaluation._generate(model, tokenizer, q, torch.device("cpu"), max_new_tokens=16,
                                        stop_ids={tokenizer.eos_token_id})
            assert text == sample["filtered_resps"][0], f"doc {sample['doc_id']}"
        ours = evaluation.benchmark(model, tokenizer, [GEN_TASK], device=torch.device("cpu"), max_questions=QUESTIONS,
                                    stop_ids={tokenizer.eos_token_id})
    assert ours["tasks"]["tiny-arith-gen"]["exact_match"] == pytest.approx(results["exact_match,strip"])


def _by_tokens(lls, q):
    """Broken: acc_norm over the choice's token count, not its characters."""
    import numpy as np

    from training import evaluation

    acc, _ = evaluation.score_choices(lls, q)
    lengths = [len(evaluation.encode_pair(_by_tokens.tokenizer, "Answer:", " " + c)[1]) for c in q.choices]
    return acc, float(int(np.argmax(np.array(lls) / np.array(lengths))) == q.answer)


def _no_delimiter(model, tokenizer, q, device):
    """Broken: the choice scored without the space lm_eval puts before it."""
    from training import evaluation

    original = evaluation.TARGET_DELIMITER
    evaluation.TARGET_DELIMITER = ""
    try:
        return evaluation.choice_loglikelihoods(model, tokenizer, q, device)
    finally:
        evaluation.TARGET_DELIMITER = original


@pytest.mark.parametrize("broken", ["acc_norm-by-tokens", "no-delimiter"])
def test_the_oracle_fails_a_broken_scorer(broken, saved_model, word_task, tmp_path, one_rank_group):
    from training.data.tokenizer import load_tokenizer

    _by_tokens.tokenizer = load_tokenizer(TOKENIZER)
    kwargs = {"score": _by_tokens} if broken == "acc_norm-by-tokens" else {"ll": _no_delimiter}
    with pytest.raises(AssertionError):
        _compare_choices(saved_model, tmp_path, word_task, **kwargs)


def test_task_files_refuse_bad_records_in_one_line(tmp_path):
    from training import evaluation

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "Q?", "choices": ["a", "b"], "answer": 5}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 1: field 'answer' must be a choice's index \(0\.\.1\)"):
        evaluation.read_task(str(bad))


def test_the_oracles_dependencies_stay_out_of_the_processes_that_load_a_model():
    """lm-eval brings scikit-learn (and scipy) into the test venv; `make install` takes them out
    again (Makefile: the oracle's tasks never score f1 or mcc, the metrics that need them).
    Left in, transformers 5.13 imports them in every process that loads its models
    (generation/candidate_generator.py ``if is_sklearn_available()``), ~1.7 CPU-s per Ray Train
    worker, job driver and spawned rank (transformers' ``is_sklearn_available`` is a ``find_spec``).
    requirements.lock still pins both (pip resolves lm-eval with them); a `pip install -e '.[dev]'`
    outside `make install` brings them back, and this test says so."""
    assert [name for name in ("sklearn", "scipy") if importlib.util.find_spec(name) is not None] == [], \
        "scikit-learn/scipy are installed: `make install` removes them (Makefile, the venv's recipe)"
