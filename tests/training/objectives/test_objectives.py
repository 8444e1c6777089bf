"""The objective plug point (training/objectives/): the registry, each objective's options judged
before any worker starts (one line naming the file, the field, the value and what is allowed),
DPO's pieces (the pairs read off a packed batch, the LoRA reference), and the rule that TRL and
lm-evaluation-harness stay test-only oracles."""
from __future__ import annotations

import pathlib
import re
import tomllib

import numpy as np
import pytest
import torch

from tiny_qwen import tiny_qwen2_config

ROOT = pathlib.Path(__file__).resolve().parents[3]
PAIRS = "training/assets/demo_corpus/preference/pairs.jsonl"


def test_each_objective_is_one_file_of_the_registry():
    from training.objectives import objective_names

    assert objective_names() == ("dpo", "sft")
    files = sorted(p.stem for p in (ROOT / "training" / "objectives").glob("*.py") if not p.stem.startswith("_"))
    assert list(objective_names()) == files


@pytest.mark.parametrize("sets, message", [
    (["train.objective=ppo"], r"train\.objective: 'ppo' is not an objective \(allowed: dpo, sft;"),
    (["train.objective_options.beta=0"], r"train\.objective_options\.beta: 0 must be a number > 0"),
    (["train.objective_options.beta=-0.1"], r"train\.objective_options\.beta: -0\.1 must be a number > 0"),
    (['train.objective_options.loss_type="hinge"'],
     r"train\.objective_options\.loss_type: 'hinge' is not allowed \(allowed: sigmoid, robust\)"),
    (["train.objective_options.label_smoothing=0.1"],
     r"train\.objective_options\.label_smoothing: 0\.1 is unused by loss_type 'sigmoid'"),
    (['train.objective_options.loss_type="robust"', "train.objective_options.label_smoothing=0.5"],
     r"train\.objective_options\.label_smoothing: 0\.5 must be a number in \[0, 0\.5\)"),
    (["train.objective_options.betta=0.2"], r"train\.objective_options\.betta: 0\.2 is not an option"),
    (["train.objective=sft", "train.objective_options={}"], r"train\.objective: 'sft' cannot train on data\.kind 'preference'"),
    (["accept.rewards_accuracy_min=1.5"], r"accept\.rewards_accuracy_min: 1\.5 must be a share between 0 and 1"),
    (['accept.benchmarks={"tiny-arith.f1" = 0.5}'], r"accept\.benchmarks\.tiny-arith\.f1: 0\.5 is not '<task>\.<metric>'"),
    (['accept.benchmarks={"mmlu.acc" = 0.5}'], r"accept\.benchmarks\.mmlu\.acc: 0\.5 names a task eval\.benchmarks does not run"),
    (['eval.benchmarks=["nope.jsonl"]'], r"eval\.benchmarks\[0\]: 'nope\.jsonl' is neither a shipped task"),
])
def test_bad_objective_settings_are_one_line_naming_file_field_value_and_allowed(sets, message):
    from training.config import JobConfigError, load_job_config

    with pytest.raises(JobConfigError) as caught:
        load_job_config(ROOT / "jobs" / "local-dpo.toml", sets)
    text = str(caught.value)
    assert "\n" not in text and text.startswith(str(ROOT / "jobs" / "local-dpo.toml")), text
    assert re.search(message, text), text


def test_dpo_needs_pairs():
    from training.config import JobConfigError, load_job_config

    with pytest.raises(JobConfigError, match=r"train\.objective: 'dpo' needs preference pairs: data\.kind 'jsonl'"):
        load_job_config(ROOT / "jobs" / "local.toml", ["train.objective=dpo"])


def test_the_defaults_are_trls_and_the_record_stores_them():
    from training import objectives
    from training.config import load_job_config

    job = load_job_config(ROOT / "jobs" / "local-dpo.toml", ['train.objective_options={beta = 0.2}'])
    assert objectives.settings(job.train.objective, job.train.objective_options) == {
        "name": "dpo", "beta": 0.2, "loss_type": "sigmoid", "label_smoothing": 0.0}
    assert objectives.settings("sft", {}) == {"name": "sft"}


def test_trl_and_lm_eval_are_test_only():
    """Never a dependency of the job: not in the train extra, not imported by training/ (the DLC
    has neither; training/objectives/dpo.py and training/evaluation.py are the job's own)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name in ("trl", "lm-eval", "lm_eval"):
        assert not any(d.replace("_", "-").startswith(name.replace("_", "-")) for d in extras["train"]), name
    assert any(d.startswith("trl==") for d in extras["dev"]) and any(d.startswith("lm-eval==") for d in extras["dev"])
    imports = re.compile(r"^\s*(import (trl|lm_eval)\b|from (trl|lm_eval)[ .])", re.MULTILINE)
    assert not [p for p in (ROOT / "training").rglob("*.py") if imports.search(p.read_text())]


def _tokenizer():
    from training.data.tokenizer import load_tokenizer

    return load_tokenizer("training/assets/qwen2.5-tokenizer")


def test_a_packed_batch_tells_each_pairs_chosen_and_rejected_completion():
    from training import model as forward
    from training.data.packing import pack
    from training.data.records import Document
    from training.data.tokenizer import tokenize_documents
    from training.objectives.dpo import pair_segments

    tokenizer = _tokenizer()
    docs = [Document(source="t", line=i, pair=("Q: 1+1?\nA:", " 2" + "!" * i, " no")) for i in range(5)]
    tokenized = tokenize_documents(tokenizer, docs)
    blocks = pack(tokenized, 64, 151643, train_separator=False, seed=0, whole_documents=True)
    batch = {k: torch.from_numpy(getattr(blocks, k).astype(np.int64)) for k in ("input_ids", "labels", "position_ids")}
    segment, pairs = pair_segments(batch, forward)
    assert pairs == 5 and blocks.num_blocks < 5  # several pairs a row, none split
    # each segment's targets decode to a completion: chosen " 2!..." + eos, rejected " no" + eos
    targets = batch["labels"][:, 1:][batch["labels"][:, 1:] != -100]
    texts = [tokenizer.decode(targets[segment == s]) for s in range(2 * pairs)]
    eos = tokenizer.eos_token
    assert sorted(texts[0::2]) == sorted(f" 2{'!' * i}{eos}" for i in range(5))
    assert texts[1::2] == [f" no{eos}"] * 5


def test_an_overlong_pair_is_dropped_or_refused_never_cut():
    from training.data.packing import pack
    from training.data.records import DataError, Document
    from training.data.tokenizer import tokenize_documents

    tokenized = tokenize_documents(_tokenizer(), [Document(source="t", line=1, pair=("Q " * 20, " yes", " no"))])
    assert pack(tokenized, 16, 0, train_separator=False, seed=0, whole_documents=True).documents_dropped == 1
    with pytest.raises(DataError, match="a preference pair of .* tokens .* does not fit train.seq_len = 16"):
        pack(tokenized, 16, 0, train_separator=False, seed=0, whole_documents=True, overlong="refuse")


def test_the_lora_reference_is_the_base_model_with_no_second_copy():
    """DPO on a LoRA model: the reference log-probs are the base model's (adapters off), and the
    objective holds no copy of the model."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from training.config import load_job_config
    from training.model import token_losses, use_chunked_loss_head, use_packed_attention
    from training.model_transforms import lora
    from training.objectives import dpo

    torch.manual_seed(0)
    config = Qwen2Config(**tiny_qwen2_config(vocab_size=151936, hidden_size=16, intermediate_size=32,
                                             num_attention_heads=2, num_key_value_heads=1))
    base = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(base.state_dict())
    lora.apply(model, {"rank": 4, "alpha": 8, "base_dtype": "float32"})
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)  # trained adapters: the policy differs from the base
    for m in (base, model):
        use_packed_attention(m)
        use_chunked_loss_head(m)
    from training import model as forward

    objective = dpo.make(model, load_job_config(ROOT / "jobs" / "local-dpo.toml"), forward)
    assert objective.frozen is None
    batch = {"input_ids": torch.randint(0, 1000, (2, 24)), "position_ids": torch.arange(24).repeat(2, 1)}
    batch["labels"] = batch["input_ids"].clone()
    reference = objective.reference_losses(model, batch, torch.device("cpu"))
    with torch.no_grad():
        torch.testing.assert_close(reference, token_losses(base, batch))
        assert not torch.allclose(token_losses(model, batch), reference)  # adapters back on afterwards


def test_a_full_fine_tune_keeps_a_frozen_copy():
    from transformers import AutoModelForCausalLM, Qwen2Config

    from training.config import load_job_config
    from training.objectives import dpo

    from training import model as forward

    model = AutoModelForCausalLM.from_config(Qwen2Config(**tiny_qwen2_config()), dtype=torch.float32)
    objective = dpo.make(model, load_job_config(ROOT / "jobs" / "local-dpo.toml"), forward)
    assert objective.frozen is not model and not any(p.requires_grad for p in objective.frozen.parameters())
    assert all(torch.equal(a, b) for a, b in zip(objective.frozen.parameters(), model.parameters()))


@pytest.mark.parametrize("record, message", [
    ({"prompt": "Q", "chosen": "a"}, "missing field 'rejected'"),
    ({"chosen": "Q a", "rejected": "Q b"}, "missing field 'prompt'.*implicit-prompt"),
    ({"prompt": "Q", "chosen": "a", "rejected": "a"}, "chosen and rejected are the same text"),
    ({"prompt": "Q", "chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"},
     "prompt, chosen and rejected must be all strings .* or all lists of messages"),
    ({"prompt": [{"role": "assistant", "content": "x"}], "chosen": [{"role": "assistant", "content": "a"}],
      "rejected": [{"role": "assistant", "content": "b"}]}, "the first assistant message must follow a user message"),
    ({"prompt": [{"role": "user", "content": "x"}], "chosen": [{"role": "user", "content": "a"}],
      "rejected": [{"role": "assistant", "content": "b"}]}, r"chosen\[0\] must be \{'role': assistant"),
])
def test_bad_preference_records_name_file_line_and_field(record, message, tmp_path):
    import json

    from training.data.formats import read_documents
    from training.data.records import DataError

    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "ok", "chosen": "yes", "rejected": "no"}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(DataError, match=rf"pairs\.jsonl, line 2: {message}"):
        read_documents(str(path), "preference")


def test_the_hf_reader_reads_preference_columns(tmp_path):
    from datasets import Dataset

    from training.data.formats import read_documents

    Dataset.from_list([{"prompt": "Q", "chosen": " a", "rejected": " b"},
                       {"prompt": "R", "chosen": " c", "rejected": " d"}]).save_to_disk(str(tmp_path / "ds"))
    docs = read_documents(str(tmp_path / "ds"), "hf").documents
    assert [d.pair for d in docs] == [("Q", " a", " b"), ("R", " c", " d")]


def test_the_shipped_pairs_read_as_pairs():
    from training.data.formats import read_documents

    docs = read_documents(str(ROOT / PAIRS), "preference").documents
    assert len(docs) == 240 and all(d.pair and d.pair[1].startswith(" The answer is") for d in docs)


def test_dpo_trains_without_dropout_as_trl_does():
    """TRL 1.16.0 DPOConfig.disable_dropout defaults to True and DPOTrainer.__init__
    (trl/trainer/dpo_trainer.py:932-935) sets p = 0 on every torch.nn.Dropout of the policy
    (trl/trainer/utils.py disable_dropout_in_model), LoRA's dropout included. The shipped 7B DPO
    job sets LoRA dropout 0.05: in train mode two forwards of the same pair must give the same
    loss, as they do under TRL."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from training import model as forward
    from training.config import load_job_config
    from training.model import use_chunked_loss_head, use_packed_attention
    from training.model_transforms import lora
    from training.objectives import dpo

    torch.manual_seed(0)
    config = Qwen2Config(**tiny_qwen2_config(vocab_size=151936, hidden_size=16, intermediate_size=32,
                                             num_attention_heads=2, num_key_value_heads=1))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    lora.apply(model, {"rank": 4, "alpha": 8, "dropout": 0.5, "base_dtype": "float32"})
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    use_packed_attention(model)
    use_chunked_loss_head(model)
    objective = dpo.make(model, load_job_config(ROOT / "jobs" / "local-dpo.toml"), forward)
    model.train()
    tokenizer = _tokenizer()
    from training.data.records import Document
    from training.data.tokenizer import tokenize_documents

    doc = tokenize_documents(tokenizer, [Document(source="t", line=1, pair=("Q: 1+1?\nA:", " 2", " no"))])[0]
    ids = torch.from_numpy(doc.ids.astype(np.int64))[None]
    labels = ids.masked_fill(~torch.from_numpy(doc.trained)[None], -100)
    starts = np.flatnonzero(doc.starts)
    positions = torch.from_numpy(np.concatenate([np.arange(b - a) for a, b in
                                                 zip(starts, list(starts[1:]) + [len(doc.ids)])]))[None]
    batch = {"input_ids": ids, "labels": labels, "position_ids": positions}
    first, _ = objective.loss(model, batch, torch.device("cpu"))
    second, _ = objective.loss(model, batch, torch.device("cpu"))
    assert torch.equal(first, second)


def test_a_benchmark_file_mixing_choice_and_generative_questions_is_refused(tmp_path):
    """lm-eval 0.4.13 gives a task ONE output_type (lm_eval/api/task.py: multiple_choice or
    generate_until for every doc); a file mixing both was scored by its first line's kind (a
    generative question sent to the choice scorer with no choices, or a choice index compared as
    text). One line naming the file, the line and the field."""
    from training.evaluation import read_task

    path = tmp_path / "mixed.jsonl"
    path.write_text('{"question": "1+1?", "choices": ["2", "3"], "answer": 0}\n'
                    '{"question": "2+2?", "answer": "4"}\n')
    with pytest.raises(ValueError, match=r"mixed.jsonl, line 2: .*'choices'"):
        read_task(str(path))


class _Scripted(torch.nn.Module):
    """Stands in for a causal LM whose greedy continuation is a fixed token list (the stop rule
    under test reads only the argmax of the last position's logits)."""

    def __init__(self, prompt_len: int, tokens: list[int], vocab: int):
        super().__init__()
        self.prompt_len, self.tokens, self.vocab = prompt_len, tokens, vocab

    def forward(self, input_ids):
        from types import SimpleNamespace

        logits = torch.zeros(1, input_ids.shape[1], self.vocab)
        logits[0, -1, self.tokens[min(input_ids.shape[1] - self.prompt_len, len(self.tokens) - 1)]] = 1.0
        return SimpleNamespace(logits=logits)


def test_generation_keeps_the_text_before_a_newline_inside_a_token(one_rank_group):
    """lm-eval 0.4.13 HFLM.generate_until (lm_eval/models/huggingface.py:1693-1705) decodes the
    continuation's tokens and cuts the TEXT at the first stop string (models/utils.py
    postprocess_generated_text): Qwen2's ".\\n" is one token, so " Paris" + ".\\n" gives
    " Paris." (then stripped: "Paris."). Dropping the whole token that holds the newline loses
    the "."."""
    from training import evaluation

    tokenizer = _tokenizer()
    q = evaluation.Question("Capital of France?", "Paris.")
    prompt = evaluation.encode_pair(tokenizer, evaluation.BENCHMARK_PROMPT.format(question=q.question), "")[0]
    model = _Scripted(len(prompt), [12095, 624, 48], len(tokenizer))  # " Paris", ".\n", "Q"
    text = evaluation._generate(model, tokenizer, q, torch.device("cpu"), max_new_tokens=8, stop_ids=set())
    assert text == "Paris."
