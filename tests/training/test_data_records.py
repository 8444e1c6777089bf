"""Bad data files are refused naming file and line, or skipped and counted under on_bad_record="skip"."""
from __future__ import annotations

import json

import pytest

from training.data.formats import read_documents
from training.data.records import DataError

GOOD_CHAT = json.dumps({"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]})

# (kind, file content, line named in the error, words the error must contain)
BAD_FILES = {
    "bad-json-line": ("jsonl", '{"text": "ok"}\n{"text": "unterminated\n{"text": "ok too"}\n', 2, "not valid JSON"),
    "missing-text-field": ("jsonl", '{"text": "ok"}\n\n{"body": "no text field"}\n', 3, "missing field 'text'"),
    "text-wrong-type": ("jsonl", '{"text": 42}\n{"text": "ok"}\n', 1, "must be a string, got int"),
    "not-an-object": ("jsonl", '{"text": "ok"}\n["a", "list"]\n', 2, "expected a JSON object, got list"),
    "empty-jsonl": ("jsonl", "\n  \n", 1, "empty file"),
    "empty-text": ("text", "", 1, "empty file"),
    "chat-missing-messages": ("chat", GOOD_CHAT + '\n{"text": "not a chat"}\n', 2, "missing field 'messages'"),
    "chat-bad-role": ("chat", GOOD_CHAT + "\n" + GOOD_CHAT.replace('"user"', '"robot"') + "\n", 2, "role is 'robot'"),
    "chat-content-not-string": ("chat", GOOD_CHAT.replace('"2"', "2") + "\n" + GOOD_CHAT + "\n", 1,
                                "content must be a string, got int"),
    "chat-no-assistant": ("chat", GOOD_CHAT + "\n" + json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n",
                          2, "no assistant message"),
    "chat-messages-not-list": ("chat", '{"messages": "hello"}\n' + GOOD_CHAT + "\n", 1, "must be a list of messages, got str"),
}


def _write(tmp_path, name: str, kind: str, content: str):
    path = tmp_path / (f"{name}.txt" if kind == "text" else f"{name}.jsonl")
    path.write_text(content, encoding="utf-8")
    return path


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_file_is_refused_with_file_and_line(tmp_path, name):
    kind, content, line, words = BAD_FILES[name]
    path = _write(tmp_path, name, kind, content)
    with pytest.raises(DataError) as err:
        read_documents(str(path), kind)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{path}, line {line}: ")
    assert words in message


@pytest.mark.parametrize("name", sorted(n for n in BAD_FILES if not n.startswith("empty")))
def test_bad_record_is_skipped_and_counted_under_skip(tmp_path, name):
    kind, content, _, _ = BAD_FILES[name]
    good = read_documents(str(_write(tmp_path, "good", kind, content)), kind, on_bad_record="skip")
    assert good.bad_records == 1
    assert len(good.documents) == len([ln for ln in content.splitlines() if ln.strip()]) - 1


def test_empty_file_in_a_directory_is_counted_under_skip(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    (tmp_path / "b.jsonl").write_text("")
    (tmp_path / "notes.md").write_text("ignored: not a .jsonl file")
    result = read_documents(str(tmp_path), "jsonl", on_bad_record="skip")
    assert (result.bad_records, [d.text for d in result.documents]) == (1, ["one", "two"])
    assert result.files == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    with pytest.raises(DataError, match=r"b\.jsonl, line 1: empty file"):
        read_documents(str(tmp_path), "jsonl")


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"first doc\n\nsecond doc caf\xe9\n")
    with pytest.raises(DataError, match=r"latin1\.txt, line 3: not valid UTF-8"):
        read_documents(str(path), "text")
    assert read_documents(str(path), "text", on_bad_record="skip").bad_records == 1


def test_all_bad_or_missing_path_is_an_error_even_under_skip(tmp_path):
    path = _write(tmp_path, "allbad", "jsonl", '{"x": 1}\n{"y": 2}\n')
    with pytest.raises(DataError, match="no usable jsonl documents .2 bad records skipped in 1 files"):
        read_documents(str(path), "jsonl", on_bad_record="skip")
    with pytest.raises(DataError, match="no such file or directory"):
        read_documents(str(tmp_path / "nope"), "text")


def test_plain_text_documents_are_blank_line_separated_with_line_numbers(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("alpha one\nalpha two\n\n\nbeta\n  \ngamma\n")
    docs = read_documents(str(path), "text").documents
    assert [(d.line, d.text) for d in docs] == [(1, "alpha one\nalpha two"), (5, "beta"), (7, "gamma")]
