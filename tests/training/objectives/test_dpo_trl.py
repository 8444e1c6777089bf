"""The oracle for the job's DPO (training/objectives/dpo.py): TRL 1.16.0 (a test-only
dependency, the release that supports transformers 5.13; the DLC has none), on a tiny Qwen2 and
the real Qwen2.5 tokenizer.

TRL's own path end to end: ``DPOTrainer`` tokenizes the pairs (``_prepare_dataset``: eos appended
to plain-text completions, the completion after the common prefix of prompt and prompt +
completion), its collator pads them into ``[chosen..., rejected...]`` rows, and
``DPOTrainer.compute_loss`` (``_compute_loss``) takes the summed completion log-probabilities of
the policy and of ``ref_model`` and returns ``-logsigmoid(beta * delta)`` (``sigmoid``) or the
``robust`` form, averaged over pairs. The job's side: its own tokenization
(training/data/tokenizer.py ``tokenize_pair``), its packing (every pair in one row, each sequence
its own document), its packed attention and chunked loss head, its DPO objective with a frozen
reference copy. Same weights, same pairs: the loss, every gradient and the reward figures must
agree. Each broken variant (chosen and rejected swapped, another beta, the prompt tokens
counted) must make the comparison fail: the oracle can tell.
"""
from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest
import torch

from tiny_qwen import tiny_qwen2_config

if importlib.util.find_spec("trl") is None:  # the dev extra pins it (pyproject.toml)
    pytest.skip("trl is not installed: the dev extra pins it", allow_module_level=True)
# trl is imported where it is used (_trl), not here: every pytest-xdist worker collects this
# module and one runs it, and importing trl takes seconds

TOKENIZER = "training/assets/qwen2.5-tokenizer"
BETA = 0.3
TEXT_PAIRS = [
    {"prompt": "Question: What is 2 + 3?\nAnswer:", "chosen": " The answer is 5.", "rejected": " No idea, sorry."},
    {"prompt": "Question: Convert 3 km to m.\nAnswer:", "chosen": " The answer is 3000 m.",
     "rejected": " Ask someone else."},
    {"prompt": "Note:", "chosen": " the rain stopped at noon", "rejected": " rain"},
]
CHAT_PAIRS = [
    {"prompt": [{"role": "user", "content": "What is 4 * 6?"}],
     "chosen": [{"role": "assistant", "content": "24"}], "rejected": [{"role": "assistant", "content": "I cannot say."}]},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 7 and 8."}],
     "chosen": [{"role": "assistant", "content": "15"}], "rejected": [{"role": "assistant", "content": "Maybe 14?"}]},
]


def _models():
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**tiny_qwen2_config(vocab_size=151936, hidden_size=16, intermediate_size=32,
                                             num_attention_heads=2, num_key_value_heads=1,
                                             tie_word_embeddings=False))
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    torch.manual_seed(1)
    reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return policy, reference


def _tokenizer():
    from training.data.tokenizer import load_tokenizer

    return load_tokenizer(TOKENIZER)


def _trl(pairs, policy, reference, *, loss_type="sigmoid", label_smoothing=0.0, tmp_path):
    """TRL's loss, its gradients by parameter name and its logged reward figures."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(output_dir=str(tmp_path / "trl"), beta=BETA, loss_type=[loss_type], label_smoothing=label_smoothing,
                     report_to=[], use_cpu=True, bf16=False, per_device_train_batch_size=len(pairs), max_length=None)
    trainer = DPOTrainer(model=policy, ref_model=reference, args=args, train_dataset=Dataset.from_list(pairs),
                         processing_class=_tokenizer())
    inputs = trainer.data_collator([trainer.train_dataset[i] for i in range(len(pairs))])
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return float(loss.detach()), grads, logged


def _batch(pairs, *, mask_prompt=True):
    """The job's batch of ``pairs``: tokenized and packed as the data pipeline does, every pair
    in one row of its own."""
    from training.data.packing import pack
    from training.data.records import Document
    from training.data.tokenizer import tokenize_documents
    from training.data.tokenizer import document_separator_id

    tokenizer = _tokenizer()
    docs = [Document(source="t", line=i, pair=tuple(tuple(v) if isinstance(v, list) else v
                                                        for v in (p["prompt"], p["chosen"], p["rejected"])))
            for i, p in enumerate(pairs)]
    tokenized = tokenize_documents(tokenizer, docs)
    if not mask_prompt:  # broken: the prompt tokens counted as completion (the sequences' first tokens stay out)
        tokenized = [type(t)(t.ids, np.ones_like(t.trained), t.starts) for t in tokenized]
    blocks = pack(tokenized, 128, document_separator_id(tokenizer), train_separator=False, seed=0, whole_documents=True)
    assert blocks.documents_dropped == 0
    return {"input_ids": torch.from_numpy(blocks.input_ids.astype(np.int64)),
            "labels": torch.from_numpy(blocks.labels.astype(np.int64)),
            "position_ids": torch.from_numpy(blocks.position_ids.astype(np.int64))}


def _ours(pairs, policy, reference, *, beta=BETA, loss_type="sigmoid", label_smoothing=0.0, swap=False,
          mask_prompt=True):
    from training import model as forward
    from training.model import use_chunked_loss_head, use_packed_attention
    from training.objectives import dpo

    for model in (policy, reference):
        use_packed_attention(model)
        use_chunked_loss_head(model)
    reference.requires_grad_(False)
    objective = dpo.DPO(beta=beta, loss_type=loss_type, label_smoothing=label_smoothing, forward=forward,
                        frozen=reference)
    batch = _batch(pairs, mask_prompt=mask_prompt)
    if swap:  # broken: chosen and rejected exchanged
        original = dpo.sequence_logps
        objective_logps = lambda *a: tuple(reversed(original(*a)))  # noqa: E731
        dpo.sequence_logps, restore = objective_logps, original
    try:
        policy.train()
        loss_sum, extra = objective.loss(policy, batch, torch.device("cpu"))
        units = objective.units(batch)
    finally:
        if swap:
            dpo.sequence_logps = restore
    (loss_sum / units).backward()
    grads = {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}
    figures = objective.figures([float(loss_sum), units, *extra.tolist()])
    return float(loss_sum / units), grads, figures


def _compare(theirs, ours):
    loss_t, grads_t, logged = theirs
    loss_o, grads_o, figures = ours
    assert loss_o == pytest.approx(loss_t, rel=1e-5, abs=1e-6), f"loss {loss_o} vs TRL {loss_t}"
    assert set(grads_o) == set(grads_t)
    for name, grad in grads_t.items():
        torch.testing.assert_close(grads_o[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
    for ours_key, trl_key in (("rewards_chosen", "rewards/chosen"), ("rewards_rejected", "rewards/rejected"),
                              ("rewards_margin", "rewards/margins"), ("rewards_accuracy", "rewards/accuracies"),
                              ("logps_chosen", "logps/chosen"), ("logps_rejected", "logps/rejected")):
        assert figures[ours_key] == pytest.approx(logged[trl_key], rel=1e-4, abs=1e-5), ours_key


_TRL_RESULTS: dict = {}
"""TRL's side per (pairs, options), computed once: the broken variants compare with the same one."""


def _run(pairs, tmp_path, trl_kwargs=None, **ours_kwargs):
    policy, reference = _models()
    key = (repr(pairs), repr(sorted((trl_kwargs or {}).items())))
    if key not in _TRL_RESULTS:
        _TRL_RESULTS[key] = _trl(pairs, copy.deepcopy(policy), copy.deepcopy(reference), tmp_path=tmp_path,
                                 **(trl_kwargs or {}))
    theirs = _TRL_RESULTS[key]
    ours = _ours(pairs, policy, reference, **{**(trl_kwargs or {}), **ours_kwargs})
    return theirs, ours


@pytest.mark.parametrize("pairs", [TEXT_PAIRS, CHAT_PAIRS], ids=["plain-text", "conversational"])
def test_loss_gradients_and_rewards_match_trl(pairs, tmp_path):
    _compare(*_run(pairs, tmp_path))


def test_robust_label_smoothing_matches_trl(tmp_path):
    _compare(*_run(TEXT_PAIRS, tmp_path, trl_kwargs={"loss_type": "robust", "label_smoothing": 0.2}))


@pytest.mark.parametrize("broken", [{"swap": True}, {"beta": 2 * BETA}, {"mask_prompt": False}],
                         ids=["sign", "beta", "masking"])
def test_the_oracle_fails_a_broken_dpo(broken, tmp_path):
    """A wrong sign (chosen and rejected exchanged), a wrong beta or the prompt tokens in the
    sums: each must fail the comparison that the job's DPO passes."""
    with pytest.raises(AssertionError):
        _compare(*_run(TEXT_PAIRS, tmp_path, **broken))
