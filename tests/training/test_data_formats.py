"""The data formats people bring, read from real files through the registry (training/data/formats/):
Alpaca and ShareGPT as JSON Lines and as one JSON array, Hugging Face datasets written by the
real ``datasets`` library (save_to_disk, Parquet, Arrow), locally and in S3 (moto); each bad
record refused in one line naming file, line or row, field and value; the tokens trained on
with the real Qwen2.5 tokenizer."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from test_data_support import cfg_for, qwen_tokenizer, s3_put_tree, use_moto

from training.config_checks import DATA_KINDS, FILE_KINDS
from training.data import build_data, formats
from training.data.formats import read_documents
from training.data.records import DataError

ALPACA = [{"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
          {"instruction": "Name a prime above 10.", "input": "", "output": "11"},
          {"instruction": "Say hi.", "output": "hi", "system": "Be brief."}]
ALPACA_MESSAGES = [
    ({"role": "user", "content": "Add the numbers.\n\n2 and 3"}, {"role": "assistant", "content": "5"}),
    ({"role": "user", "content": "Name a prime above 10."}, {"role": "assistant", "content": "11"}),
    ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."},
     {"role": "assistant", "content": "hi"}),
]
SHAREGPT = [{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "2+2?"},
                               {"from": "gpt", "value": "4"}, {"from": "human", "value": "and 3+3?"},
                               {"from": "gpt", "value": "6"}]},
            {"id": "x1", "conversations": [{"from": "human", "value": "Capital of France?"},
                                           {"from": "gpt", "value": "Paris"}]}]
SHAREGPT_MESSAGES = [
    ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
     {"role": "assistant", "content": "6"}),
    ({"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris"}),
]


def _jsonl(records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_the_kinds_are_the_files_of_the_registry():
    assert FILE_KINDS == ("alpaca", "chat", "hf", "jsonl", "preference", "sharegpt", "text")
    assert DATA_KINDS == ("synthetic", *FILE_KINDS)
    assert [kind for kind, _ in formats.record_formats()] == ["alpaca", "chat", "sharegpt", "preference", "jsonl"]


@pytest.mark.parametrize("kind, records, expected", [("alpaca", ALPACA, ALPACA_MESSAGES),
                                                     ("sharegpt", SHAREGPT, SHAREGPT_MESSAGES)])
def test_json_lines_and_one_json_array_give_the_same_conversations(tmp_path, kind, records, expected):
    (tmp_path / "lines.jsonl").write_text(_jsonl(records))
    (tmp_path / "array.json").write_text(json.dumps(records, indent=2))
    lines = read_documents(str(tmp_path / "lines.jsonl"), kind).documents
    array = read_documents(str(tmp_path / "array.json"), kind).documents
    assert [d.messages for d in lines] == [d.messages for d in array] == expected
    assert [d.line for d in lines] == list(range(1, len(records) + 1))
    both = read_documents(str(tmp_path), kind)  # a folder: both files, sorted
    assert both.files == [str(tmp_path / "array.json"), str(tmp_path / "lines.jsonl")]


# (kind, records (the last one bad), the one-line problem)
BAD = [
    ("alpaca", ALPACA[:1] + [{"instruction": "x", "output": 5}], "field 'output' must be a string, got int (5)"),
    ("alpaca", ALPACA[:1] + [{"instruction": "x", "response": "y"}], "missing field 'output'; found: instruction, response"),
    ("alpaca", ALPACA[:1] + [{"instruction": " ", "output": "y"}], "field 'instruction' is empty"),
    ("alpaca", ALPACA[:1] + [{"instruction": "x", "input": ["a"], "output": "y"}], "field 'input' must be a string, got list (['a'])"),
    ("sharegpt", SHAREGPT[1:] + [{"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "f()"}]}],
     "conversations[1].from is 'function_call': tool turns are not supported (the chat template is given system, "
     "user, assistant turns only); allowed: human, user, gpt"),
    ("sharegpt", SHAREGPT[1:] + [{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"},
                                                    {"from": "observation", "value": "r"}]}],
     "conversations[2].from is 'observation': tool turns are not supported"),
    ("alpaca", ALPACA[:1] + [{"instruction": "x", "output": "y", "history": [["only one"]]}],
     "history[0] must be an [instruction, response] pair of strings, got ['only one']"),
    ("alpaca", ALPACA[:1] + [{"instruction": "x", "output": "y", "history": "h"}],
     "field 'history' must be a list of [instruction, response] pairs, got str ('h')"),
    ("sharegpt", SHAREGPT[1:] + [{"conversations": [{"from": "human", "value": "q"}]}], "no assistant message (nothing to train on)"),
    ("sharegpt", SHAREGPT[1:] + [{"conversations": [{"from": "gpt", "text": "a"}]}], "conversations[0] must be an object with 'from' and 'value', got {'from': 'gpt', 'text': 'a'}"),
    ("sharegpt", SHAREGPT[1:] + [{"messages": []}], "missing field 'conversations'"),
]


@pytest.mark.parametrize("kind, records, problem", BAD)
def test_a_bad_record_is_one_line_naming_file_line_field_and_value(tmp_path, kind, records, problem):
    lines, array = tmp_path / "d.jsonl", tmp_path / "d.json"
    lines.write_text(_jsonl(records))
    array.write_text(json.dumps(records, indent=2))
    text = array.read_text()
    array_line = text[:text.rindex("\n  {")].count("\n") + 2  # where the last element starts
    for path, line in ((lines, len(records)), (array, array_line)):
        with pytest.raises(DataError) as err:
            read_documents(str(path), kind)
        assert "\n" not in str(err.value)
        assert str(err.value).startswith(f"{path}, line {line}: {problem}"), str(err.value)
        skipped = read_documents(str(path), kind, on_bad_record="skip")
        assert (skipped.bad_records, len(skipped.documents)) == (1, len(records) - 1)


def test_a_sharegpt_system_field_is_the_system_turn_unless_one_opens_the_conversation(tmp_path):
    """Oracle: hiyouga/LLaMA-Factory data/README.md "Sharegpt Format" (``"system": "system prompt
    (optional)"`` beside ``conversations``) and src/llamafactory/data/converter.py
    ``SharegptDatasetConverter.__call__``: a leading ``system`` turn is the system prompt, else
    ``example[system]``. Read from JSON Lines and from an hf column alike."""
    turns = SHAREGPT[1]["conversations"]
    records = [{"conversations": turns, "system": "Be brief."},
               {"conversations": SHAREGPT[0]["conversations"], "system": "ignored: a system turn opens it"},
               {"conversations": turns, "system": None}]
    expected = [({"role": "system", "content": "Be brief."}, *SHAREGPT_MESSAGES[1]), SHAREGPT_MESSAGES[0],
                SHAREGPT_MESSAGES[1]]
    (tmp_path / "s.jsonl").write_text(_jsonl(records))
    _dataset(records).to_parquet(str(tmp_path / "s.parquet"))
    assert _as_read(str(tmp_path / "s.jsonl"), "sharegpt") == _as_read(str(tmp_path / "s.parquet")) == expected


def test_an_alpaca_history_becomes_the_turns_before_the_instruction(tmp_path):
    """Oracle: hiyouga/LLaMA-Factory data/README.md "Alpaca Format" (``"history": [["user
    instruction in the first round (optional)", "model response in the first round (optional)"],
    ...]``) and src/llamafactory/data/converter.py ``AlpacaDatasetConverter.__call__``: each pair
    appended as a user then an assistant turn, before the instruction's user turn."""
    record = {"instruction": "And 3+3?", "input": "", "output": "6", "system": "Be brief.",
              "history": [["2+2?", "4"], ["And 1+1?", "2"]]}
    expected = [({"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 1+1?"},
                  {"role": "assistant", "content": "2"}, {"role": "user", "content": "And 3+3?"},
                  {"role": "assistant", "content": "6"})]
    (tmp_path / "a.jsonl").write_text(_jsonl([record]))
    _dataset([record]).to_parquet(str(tmp_path / "a.parquet"))
    assert _as_read(str(tmp_path / "a.jsonl"), "alpaca") == _as_read(str(tmp_path / "a.parquet")) == expected


def test_leading_assistant_turns_are_dropped_and_counted_in_the_data_check(tmp_path):
    """Oracle: lm-sys/FastChat fastchat/train/train.py ``preprocess``: ``if roles[source[0]["from"]]
    != conv.roles[0]: # Skip the first one if it is not from human; source = source[1:]``. The
    row is kept without its leading assistant turn(s), and the data check's report counts them."""
    from fixture_paths import FIXTURE_JOBS
    from training.config import load_job_config
    from training.data.check import check_data

    hello = {"from": "gpt", "value": "Hello! How can I help?"}
    records = [{"conversations": [hello, *SHAREGPT[1]["conversations"]]},
               {"conversations": [SHAREGPT[0]["conversations"][0], hello, hello, *SHAREGPT[1]["conversations"]]}]
    (tmp_path / "s.jsonl").write_text(_jsonl(records * 20))
    read = read_documents(str(tmp_path / "s.jsonl"), "sharegpt")
    assert [d.messages for d in read.documents[:2]] == [SHAREGPT_MESSAGES[1],
                                                       ({"role": "system", "content": "Be brief."}, *SHAREGPT_MESSAGES[1])]
    assert (read.dropped_turns, read.bad_records) == (60, 0)
    job = load_job_config(FIXTURE_JOBS / "local.toml", ["data.kind=sharegpt", f"data.path={tmp_path / 's.jsonl'}"])
    assert check_data(job).summary.endswith(", 60 leading assistant turns dropped")


def test_hf_columns_of_two_conversation_formats_are_refused_and_from_value_messages_get_an_hf_hint(tmp_path):
    """A row with alpaca's and sharegpt's columns has two readings (it was read as alpaca, the
    format needing more columns); ``messages`` holding ShareGPT turns in an hf dataset cannot be
    fixed by data.kind (hf picks the format by column: the column must be ``conversations``)."""
    _dataset([{**ALPACA[0], **SHAREGPT[1]}]).to_parquet(str(tmp_path / "both.parquet"))
    with pytest.raises(DataError, match=r"both\.parquet: columns instruction, input, output, id, conversations match "
                                         r"more than one record format \(alpaca \(instruction, output\); sharegpt "
                                         r"\(conversations\)\); keep the columns of one"):
        read_documents(str(tmp_path / "both.parquet"), "hf")
    _dataset([{"messages": SHAREGPT[1]["conversations"]}]).to_parquet(str(tmp_path / "m.parquet"))
    with pytest.raises(DataError) as err:
        read_documents(str(tmp_path / "m.parquet"), "hf")
    assert str(err.value).endswith("row 1: messages[0] has no 'role' but 'from': ShareGPT turns ({'from', 'value'}) "
                                   "are read from a 'conversations' field (data.kind 'sharegpt'; in an hf dataset, a "
                                   "column named 'conversations')")
    _dataset([{"text": "rendered", **SHAREGPT[1]}]).to_parquet(str(tmp_path / "t.parquet"))  # text: a rendering
    assert _as_read(str(tmp_path / "t.parquet")) == [SHAREGPT_MESSAGES[1]]


def test_chat_records_given_as_sharegpt_turns_point_at_the_sharegpt_kind(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(_jsonl(SHAREGPT))
    with pytest.raises(DataError, match=r"c\.jsonl, line 1: missing field 'messages' .*set data.kind = 'sharegpt'"):
        read_documents(str(path), "chat")


def test_a_broken_json_array_names_the_line_of_the_error(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('[\n  {"instruction": "a", "output": "b"},\n  {"instruction": "c", "output": }\n]\n')
    with pytest.raises(DataError, match=r"d\.json, line 3: not valid JSON \(Expecting value at column 34\)"):
        read_documents(str(path), "alpaca")


def test_the_head_of_a_large_json_array_gives_the_records_it_holds_whole(tmp_path):
    """The data check reads the head of an S3 object (training/data/check.py): a cut-off last
    element is not a bad record; a real syntax error inside the head still is."""
    from training.data.records import Reader
    from training.storage.files import list_files

    path = tmp_path / "big.json"
    path.write_text(json.dumps(ALPACA * 50, indent=2))
    reader = Reader("error")
    assert formats.get("alpaca").read(reader, list_files(str(path))[0], 1000) is False
    assert 0 < len(reader.result.documents) < 150 and reader.result.bad_records == 0
    path.write_text(path.read_text().replace('"output": "11"', '"output": 11,,', 1))
    with pytest.raises(DataError, match=r"big\.json, line 10: not valid JSON"):
        formats.get("alpaca").read(Reader("error"), list_files(str(path))[0], 1000)


def test_alpaca_labels_only_the_output_with_the_real_tokenizer(tmp_path):
    """The Alpaca record trains on its output and the end of the turn, as every conversation."""
    path = tmp_path / "a.jsonl"
    path.write_text(_jsonl(ALPACA * 20))
    bundle = build_data(cfg_for("alpaca", str(path), seq_len=64, world=1, gb=2, eval_fraction=0.1),
                        qwen_tokenizer(), rank=0, world_size=1, cache_dir=tmp_path / "cache")
    batch = bundle.train.next_batch()
    tok = qwen_tokenizer()
    trained = {tok.decode([t]) for t in batch["labels"][batch["labels"] != -100].tolist()}
    assert trained <= {"5", "1", "11", "hi", "<|im_end|>"} and "<|im_end|>" in trained
    assert bundle.stats.kind == "alpaca" and bundle.stats.documents == 60
    assert {p.answer for p in bundle.eval_prompts} <= {"5", "11", "hi"} and bundle.eval_prompts


# --- Hugging Face datasets, written by the real library ----------------------------------------

def _dataset(rows):
    """A Dataset of ``rows``; a key some rows lack is null there (``from_list`` takes the first row's keys)."""
    datasets = pytest.importorskip("datasets")  # a dev dependency: the DLC's version, pinned
    keys = list(dict.fromkeys(k for row in rows for k in row))
    return datasets.Dataset.from_list([{k: row.get(k) for k in keys} for row in rows])


def _as_read(path: str, kind: str = "hf"):
    return [d.messages or d.text for d in read_documents(path, kind).documents]


def test_save_to_disk_is_read_in_the_order_datasets_loads_it(tmp_path):
    """Oracle: huggingface/datasets 5.0.0 src/datasets/arrow_dataset.py ``save_to_disk`` (l. 1877:
    ``state["_data_files"]`` = ``data-{i:05d}-of-{n:05d}.arrow``, each written by ``ArrowWriter``,
    a ``pa.RecordBatchStreamWriter``: arrow_writer.py l. 601) and ``load_from_disk`` (l. 2065-2080:
    the files of ``_data_files`` concatenated in that order). Shuffled and saved in 3 shards,
    the rows come back in ``load_from_disk``'s order."""
    import datasets

    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(30)]
    _dataset(rows).shuffle(seed=3).save_to_disk(str(tmp_path / "ds"), num_shards=3)
    expected = [tuple(r["messages"]) for r in datasets.load_from_disk(str(tmp_path / "ds"))]
    assert _as_read(str(tmp_path / "ds")) == expected and expected != [tuple(r["messages"]) for r in rows]
    assert len(formats.files_of(str(tmp_path / "ds"), "hf")) == 3


def test_a_saved_dataset_dict_is_read_from_its_train_split(tmp_path, monkeypatch):
    """Oracle: datasets 5.0.0 dataset_dict.py ``save_to_disk``/``load_from_disk`` (l. 1432): the
    splits named in ``dataset_dict.json``, one folder each."""
    import datasets

    train = _dataset([{"text": f"train document {i}"} for i in range(5)])
    test = _dataset([{"text": f"test document {i}"} for i in range(3)])
    datasets.DatasetDict(train=train, test=test).save_to_disk(str(tmp_path / "dd"))
    assert _as_read(str(tmp_path / "dd")) == [f"train document {i}" for i in range(5)]
    monkeypatch.chdir(tmp_path)
    assert _as_read("./dd/") == [f"train document {i}" for i in range(5)]  # a relative path, as jobs give one
    datasets.DatasetDict(validation=test).save_to_disk(str(tmp_path / "nodict"))
    with pytest.raises(DataError, match=r"dataset_dict\.json: a DatasetDict without a 'train' split \(splits: validation\)"):
        read_documents(str(tmp_path / "nodict"), "hf")


def test_a_folder_of_files_is_read_from_its_train_split_as_datasets_assigns_splits(tmp_path):
    """Oracle: huggingface/datasets 5.0.0 src/datasets/data_files.py: ``SPLIT_PATTERN_SHARDED``
    (l. 41, ``data/{split}-00000-of-00001*.*``) first, then split keywords in folder names, then in
    file names (``SPLIT_KEYWORDS`` l. 43-47, patterns l. 48-97, ``_get_data_files_patterns``
    l. 257-297); ``__``-prefixed and hidden folders skipped (l. 190). ``load_dataset`` itself
    is the oracle for the Hub layout and for its own cache folder (``json-train.arrow`` beside
    ``json-test.arrow`` and a ``.map`` result ``cache-<hash>.arrow``)."""
    import datasets

    def texts(tag, n=2):
        return _dataset([{"text": f"{tag}{i}"} for i in range(n)])

    hub = tmp_path / "hub" / "data"
    hub.mkdir(parents=True)
    for split in ("train", "test", "validation"):
        texts(split).to_parquet(str(hub / f"{split}-00000-of-00001.parquet"))
    (tmp_path / "hub" / "__skip").mkdir()
    texts("skipped").to_parquet(str(tmp_path / "hub" / "__skip" / "x.parquet"))
    oracle = datasets.load_dataset("parquet", data_dir=str(tmp_path / "hub"), cache_dir=str(tmp_path / "c1"))
    assert _as_read(str(tmp_path / "hub")) == list(oracle["train"]["text"]) == ["train0", "train1"]

    for split in ("train", "test"):
        (tmp_path / f"{split}.json").write_text(json.dumps([{"text": f"{split}{i}"} for i in range(2)]))
    built = datasets.load_dataset("json", data_files={s: str(tmp_path / f"{s}.json") for s in ("train", "test")},
                                  cache_dir=str(tmp_path / "c2"))
    built["train"].map(lambda row: {"text": row["text"] + " mapped"})  # writes cache-<hash>.arrow beside them
    folder = built["train"].cache_files[0]["filename"].rsplit("/", 1)[0]
    assert _as_read(folder) == list(built["train"]["text"]) == ["train0", "train1"]

    only_test = tmp_path / "only_test"
    only_test.mkdir()
    texts("v").to_parquet(str(only_test / "dev.parquet"))
    texts("t").to_parquet(str(only_test / "test.parquet"))
    with pytest.raises(DataError, match=r"only_test: its files are split \(validation: dev\.parquet; test: "
                                         r"test\.parquet\) and none is a train split"):
        read_documents(str(only_test), "hf")
    caches = tmp_path / "caches"
    caches.mkdir()
    for name in ("cache-0a1b.arrow", "cache-2c3d.arrow"):
        shutil.copy(built["train"].cache_files[0]["filename"], caches / name)
    with pytest.raises(DataError, match=r"caches: cache-0a1b\.arrow, cache-2c3d\.arrow are datasets cache files"):
        read_documents(str(caches), "hf")


def test_a_saved_dataset_below_the_folder_is_never_read_as_loose_files(tmp_path):
    """Oracle: datasets 5.0.0 ``load_from_disk`` reads a saved dataset only through its own
    ``state.json``/``dataset_dict.json`` (arrow_dataset.py l. 2065, dataset_dict.py l. 1432); read
    as loose files, the parent of a saved DatasetDict mixes its test rows into training."""
    import datasets

    datasets.DatasetDict(train=_dataset([{"text": "train0"}]),
                         test=_dataset([{"text": "test0"}])).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError) as err:
        read_documents(str(tmp_path), "hf")
    assert str(err.value) == (f"{tmp_path}: holds a saved dataset in dd/ (save_to_disk's state.json / "
                              "dataset_dict.json); point data.path at that folder, not at a folder above it")


def test_parquet_and_arrow_files_pick_the_record_format_by_their_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.feather as feather

    _dataset(ALPACA).to_parquet(str(tmp_path / "alpaca.parquet"))
    _dataset(SHAREGPT).to_parquet(str(tmp_path / "sharegpt.parquet"))
    table = pa.table({"text": ["one doc", "two doc"], "source": ["a", "b"]})
    feather.write_feather(table, str(tmp_path / "file.arrow"))  # the IPC file format
    with pa.OSFile(str(tmp_path / "stream.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    assert _as_read(str(tmp_path / "alpaca.parquet")) == ALPACA_MESSAGES
    assert _as_read(str(tmp_path / "sharegpt.parquet")) == SHAREGPT_MESSAGES
    assert _as_read(str(tmp_path / "file.arrow")) == _as_read(str(tmp_path / "stream.arrow")) == ["one doc", "two doc"]


def test_a_bad_row_names_file_row_field_and_value(tmp_path):
    _dataset(ALPACA + [{"instruction": "x", "input": None, "output": ""}]).save_to_disk(str(tmp_path / "ds"))
    shard = tmp_path / "ds" / "data-00000-of-00001.arrow"
    with pytest.raises(DataError) as err:
        read_documents(str(tmp_path / "ds"), "hf")
    assert str(err.value) == f"{shard}, row 4: field 'output' is empty"
    assert read_documents(str(tmp_path / "ds"), "hf", on_bad_record="skip").bad_records == 1
    _dataset([{"prompt": "p", "completion": "c"}]).to_parquet(str(tmp_path / "other.parquet"))
    with pytest.raises(DataError, match=r"other\.parquet: columns prompt, completion match no record format "
                                         r"\(rows need: alpaca \(instruction, output\); chat \(messages\)"):
        read_documents(str(tmp_path / "other.parquet"), "hf")


def test_one_corpus_is_all_conversations_or_all_text(tmp_path):
    _dataset(ALPACA).to_parquet(str(tmp_path / "a.parquet"))
    _dataset([{"text": "plain"}]).to_parquet(str(tmp_path / "b.parquet"))
    with pytest.raises(DataError, match=r"b\.parquet, line 1: text, but .*a\.parquet, line 1 is a conversation"):
        read_documents(str(tmp_path), "hf")


def test_a_saved_dataset_in_s3_is_read_like_a_local_one(tmp_path, monkeypatch):
    use_moto(monkeypatch)
    _dataset(ALPACA * 2).save_to_disk(str(tmp_path / "ds"), num_shards=2)
    s3_put_tree("hf-data", "saved/ds", {p.name: p.read_bytes() for p in (tmp_path / "ds").iterdir()})
    assert _as_read("s3://hf-data/saved/ds") == _as_read(str(tmp_path / "ds")) == ALPACA_MESSAGES * 2
    assert [f.uri.rsplit("/", 1)[-1] for f in formats.files_of("s3://hf-data/saved/ds", "hf")] == [
        "data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]


def test_hf_text_rows_train_every_token_with_the_real_tokenizer(tmp_path):
    text = "The quick brown fox jumps over the lazy dog near the river bank."
    _dataset([{"text": f"{text} {i}"} for i in range(40)]).save_to_disk(str(tmp_path / "ds"))
    bundle = build_data(cfg_for("hf", str(tmp_path / "ds"), seq_len=32, world=1, gb=2),
                        qwen_tokenizer(), rank=0, world_size=1, cache_dir=tmp_path / "cache")
    batch = bundle.train.next_batch()
    ids, labels, positions = (batch[k].numpy() for k in ("input_ids", "labels", "position_ids"))
    # text: every token is a target but the first of each document (nothing before it predicts it)
    assert np.array_equal(labels == -100, positions == 0) and np.array_equal(labels[labels != -100], ids[labels != -100])
    assert bundle.stats.kind == "hf" and bundle.eval_prompts == []


# --- the code archive: data read as the job reads it ---------------------------------------------

_BUILD = """
import json, sys
import training
from training.config import load_job_config
from training.data import build_data
from training.data.tokenizer import load_tokenizer, tokenizer_location
for sets in json.loads(sys.argv[2]):
    job = load_job_config("jobs/local.toml", sets)
    bundle = build_data(job, load_tokenizer(tokenizer_location(job.model)), rank=0, world_size=2, cache_dir=sys.argv[1])
    print(json.dumps({"code": training.__file__, "stats": bundle.stats.to_dict(), "prompts": len(bundle.eval_prompts)}))
"""


QA_FORMAT = '''"""qa: {"q", "a"} per line, a one-turn conversation."""
from training.data.records import record_format, string_field


def qa_record(record):
    return {"messages": ({"role": "user", "content": string_field(record, "q")},
                         {"role": "assistant", "content": string_field(record, "a")})}


FORMAT = record_format(summary='{"q", "a"}', record=qa_record, columns=("q", "a"), conversations=True)
'''


def test_each_format_is_read_from_the_unpacked_code_archive(tmp_path):
    """What Ray does on a node: unpack the working_dir archive and run the job in it. The
    registry finds its formats in the unpacked folder; ``--check`` (the driver's check) and
    ``build_data`` (what each worker runs) read every new format from there, and a format added
    there as one file is a kind the job accepts."""
    import os
    import subprocess
    import sys
    import zipfile

    from charts.code_bundle import build_code_bundle
    from test_data_support import ROOT, qwen_tokenizer_dir

    data = tmp_path / "data"
    data.mkdir()
    (data / "alpaca.json").write_text(json.dumps(ALPACA * 20))
    (data / "sharegpt.jsonl").write_text(_jsonl(SHAREGPT * 30))
    _dataset(ALPACA * 20).save_to_disk(str(data / "hf"), num_shards=2)
    with zipfile.ZipFile(build_code_bundle(ROOT, tmp_path / "dist").path) as zf:
        zf.extractall(tmp_path / "wd")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cases = [("alpaca", data / "alpaca.json"), ("sharegpt", data / "sharegpt.jsonl"), ("hf", data / "hf")]
    every = [[f"data.kind={kind}", f"data.path={path}", f"model.tokenizer={qwen_tokenizer_dir()}"] for kind, path in cases]
    for (kind, path), sets in zip(cases, every):
        check = subprocess.run([sys.executable, "-m", "training", "--config", "jobs/local.toml", "--check",
                                *(a for s in sets for a in ("--set", s))], cwd=tmp_path / "wd", env=env,
                               capture_output=True, text=True, timeout=300)
        assert check.returncode == 0, check.stderr
        assert f"  data   {path}: 60 {kind} documents in " in check.stdout
    # A new format is one file: dropped into the unpacked tree, the job config accepts its kind
    # and the driver's check reads with it.
    (tmp_path / "wd" / "training" / "data" / "formats" / "qa.py").write_text(QA_FORMAT)
    (data / "qa.jsonl").write_text(_jsonl([{"q": f"{i} + 1?", "a": str(i + 1)} for i in range(60)]))
    qa = subprocess.run([sys.executable, "-m", "training", "--config", "jobs/local.toml", "--check", "--set",
                         "data.kind=qa", "--set", f"data.path={data / 'qa.jsonl'}"], cwd=tmp_path / "wd", env=env,
                        capture_output=True, text=True, timeout=300)
    assert qa.returncode == 0 and f"{data / 'qa.jsonl'}: 60 qa documents in 1 file(s)" in qa.stdout, qa.stderr
    built = subprocess.run([sys.executable, "-c", _BUILD, str(tmp_path / "cache"), json.dumps(every)],
                           cwd=tmp_path / "wd", env=env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    for (kind, _), line in zip(cases, built.stdout.strip().splitlines()[-3:]):
        out = json.loads(line)
        assert out["code"] == str(tmp_path / "wd" / "training" / "__init__.py")  # the archive's code ran
        assert out["stats"]["kind"] == kind and out["stats"]["documents"] == 60
        assert 0 < out["stats"]["target_fraction"] < 0.5 and out["prompts"] > 0  # conversations: answers only


def test_the_data_check_names_the_row_and_refuses_exact_match_on_text(tmp_path):
    """``--check``, the preflight and the driver read with the same reader: a bad row is the same
    one line; exact match needs conversations, which only the documents can tell for ``hf``."""
    from fixture_paths import FIXTURE_JOBS
    from training.config import load_job_config
    from training.data.check import check_data

    _dataset(ALPACA * 20 + [{"instruction": "x", "output": " "}]).save_to_disk(str(tmp_path / "bad"))
    _dataset([{"text": f"plain document number {i} " * 4} for i in range(40)]).save_to_disk(str(tmp_path / "text"))
    _dataset(ALPACA * 20).save_to_disk(str(tmp_path / "good"))

    def job(path, *extra):
        return load_job_config(FIXTURE_JOBS / "local.toml", ["data.kind=hf", f"data.path={tmp_path / path}", *extra])

    with pytest.raises(DataError) as err:
        check_data(job("bad"))
    shard = tmp_path / "bad" / "data-00000-of-00001.arrow"
    assert str(err.value) == (f"{FIXTURE_JOBS / 'local.toml'}: data.path: {shard}, row 61: field 'output' is empty")
    with pytest.raises(DataError, match=r"eval\.exact_match: True needs conversations, but .*text holds text documents"):
        check_data(job("text", "eval.exact_match=true"))
    assert check_data(job("good", "eval.exact_match=true")).documents == 60
