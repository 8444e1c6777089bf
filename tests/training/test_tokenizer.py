"""The offline-built Qwen2.5 tokenizer equals the real one; load_tokenizer reads dirs and s3://."""
from __future__ import annotations

import json
import pytest
from test_data_support import qwen_tokenizer, qwen_tokenizer_dir, s3_put_tree, use_moto

from training.storage.files import fetch_prefix
from training.data.tokenizer import TokenizerError, document_separator_id, load_tokenizer

# transformers' own Qwen2 tokenization integration test (tests/models/qwen2/test_tokenization_qwen2.py,
# test_tokenizer_integration, revision 5909c822 of Qwen/Qwen-tokenizer): strings and expected ids.
HF_SEQUENCES = [
    "Transformers (formerly known as pytorch-transformers and pytorch-pretrained-bert) provides "
    "general-purpose architectures (BERT, GPT-2, RoBERTa, XLM, DistilBert, XLNet...) for Natural "
    "Language Understanding (NLU) and Natural Language Generation (NLG) with over 32+ pretrained "
    "models in 100+ languages and deep interoperability between Jax, PyTorch and TensorFlow.",
    "🤗 Transformers 提供了可以轻松地下载并且训练先进的预训练模型的 API 和工具。使用预训练模型可以减少计算消耗和碳排放，并且节省从头训练所需要的时间和资源。",
    """```python\ntokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen-tokenizer")\n"""
    """tokenizer("世界，你好！")```""",
]
HF_EXPECTED_IDS = [
    [8963, 388, 320, 69514, 3881, 438, 4510, 27414, 32852, 388, 323, 4510, 27414, 21334, 35722, 1455, 529, 8,
     5707, 4586, 58238, 77235, 320, 61437, 11, 479, 2828, 12, 17, 11, 11830, 61437, 64, 11, 1599, 10994, 11,
     27604, 321, 33, 529, 11, 29881, 6954, 32574, 369, 18448, 11434, 45451, 320, 45, 23236, 8, 323, 18448,
     11434, 23470, 320, 30042, 38, 8, 448, 916, 220, 18, 17, 10, 80669, 4119, 304, 220, 16, 15, 15, 10,
     15459, 323, 5538, 94130, 2897, 1948, 619, 706, 11, 5355, 51, 21584, 323, 94986, 13],
    [144834, 80532, 93685, 83744, 34187, 73670, 104261, 29490, 62189, 103937, 104034, 102830, 98841, 104034,
     104949, 9370, 5333, 58143, 102011, 1773, 37029, 98841, 104034, 104949, 73670, 101940, 100768, 104997,
     33108, 100912, 105054, 90395, 100136, 106831, 45181, 64355, 104034, 113521, 101975, 33108, 85329, 1773],
    [73594, 12669, 198, 85593, 284, 8979, 37434, 6387, 10442, 35722, 445, 48, 16948, 45274, 16948, 34841,
     3135, 1138, 85593, 445, 99489, 3837, 108386, 6313, 899, 73594],
]


def test_ids_equal_transformers_qwen2_integration_ids():
    tok = qwen_tokenizer()
    assert [tok(s)["input_ids"] for s in HF_SEQUENCES] == HF_EXPECTED_IDS


def test_special_ids_vocab_size_and_settings():
    tok = qwen_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|file_sep|>")}
    assert ids == {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|file_sep|>": 151664}
    assert len(tok) == 151665  # the model's embedding is 151,936 wide (padded); ids stay below it
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    assert tok("<|im_start|>hello<|im_end|>")["input_ids"] == [151644, 14990, 151645]
    assert document_separator_id(tok) == 151643


def test_nfc_normalisation_and_single_digit_split():
    tok = qwen_tokenizer()
    # U+03D2 U+0301 (NFD) must tokenize exactly like U+03D3 (its NFC form)
    assert tok("\u03d2\u0301")["input_ids"] == tok("\u03d3")["input_ids"]
    # Qwen2 splits digits one by one (\p{N}, not \p{N}{1,3} as in cl100k)
    assert tok.convert_ids_to_tokens(tok("12345")["input_ids"]) == ["1", "2", "3", "4", "5"]


def test_chat_template_is_qwen25_and_lives_in_tokenizer_config():
    tok = qwen_tokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
                                   tokenize=False)
    assert text == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                    "<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n")
    config = json.loads((qwen_tokenizer_dir() / "tokenizer_config.json").read_text())
    assert "You are Qwen" in config["chat_template"]
    assert config["tokenizer_class"] == "Qwen2Tokenizer"


def test_rebuild_is_skipped_when_current(capsys):
    from devtools.tokenizer_build import main

    out = qwen_tokenizer_dir()
    before = (out / "tokenizer.json").stat().st_mtime_ns
    assert main(["--out", str(out)]) == 0
    assert "up to date" in capsys.readouterr().out
    assert (out / "tokenizer.json").stat().st_mtime_ns == before


def test_load_tokenizer_refuses_a_dir_without_tokenizer(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)


def test_load_tokenizer_from_s3_downloads_once_per_node(tmp_path, monkeypatch):
    use_moto(monkeypatch)
    src = qwen_tokenizer_dir()
    s3_put_tree("tok-bucket", "models/qwen", {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()})
    cache = tmp_path / "cache"
    tok = load_tokenizer("s3://tok-bucket/models/qwen", cache_dir=cache)
    assert tok("<|im_start|>hello<|im_end|>")["input_ids"] == [151644, 14990, 151645]
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    stamp = (entry / "tokenizer.json").stat().st_mtime_ns
    # another rank on the same node: finds the completed copy, downloads nothing
    assert fetch_prefix("s3://tok-bucket/models/qwen", cache_dir=cache) == entry
    assert (entry / "tokenizer.json").stat().st_mtime_ns == stamp
    with pytest.raises(TokenizerError, match="s3://tok-bucket/nothing-here"):
        load_tokenizer("s3://tok-bucket/nothing-here", cache_dir=cache)


def test_concurrent_ranks_on_a_node_download_a_prefix_once(tmp_path, monkeypatch):
    import threading

    from training.storage import files as remote

    use_moto(monkeypatch)
    s3_put_tree("tok-bucket", "small/prefix", {"a.json": b"{}", "sub/b.txt": b"bee"})
    calls, real = [], remote._fetch_file
    monkeypatch.setattr(remote, "_fetch_file", lambda fs, path, out: calls.append(path) or real(fs, path, out))  # counts, still real
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        fetch_prefix("s3://tok-bucket/small/prefix", cache_dir=tmp_path))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 4
    assert sorted(calls) == ["tok-bucket/small/prefix/a.json", "tok-bucket/small/prefix/sub/b.txt"]
    assert (results[0] / "sub" / "b.txt").read_bytes() == b"bee"
