"""Every bad input of the battery (tests/validation/cases.py) is refused in ONE line that names the
field, by the fastest entry point that can see it."""
from __future__ import annotations

import contextlib
import copy
import tomllib
from pathlib import Path

import pytest

from cases import (CHAT_OK, OVERLONG_CHAT, _lines, DATA_CASES, ENV_CASES, JOB_CASES, LOCAL_JOB, MODEL_DIR_CASES, PLAN_CASES, ROOT)
from environment import SpecError, environment_from_dict, load_environment
from training.config import JobConfigError, load_job_config
from training.data.check import check_data
from training.data.records import DataError
from training.model_config import check_model
from fixtures_s3 import no_session_s3  # noqa: F401  (a fixture)

# The plans read S3 through the preflight: the session's moto server, when an earlier test
# started it, must not decide their outcome.
pytestmark = pytest.mark.usefixtures("no_session_s3")



def _one_line(err: BaseException, *words: str) -> str:
    text = str(err)
    assert "\n" not in text, text
    for w in words:
        assert w in text, text
    return text


@pytest.fixture(scope="module")
def raw_env() -> dict:
    return tomllib.loads((ROOT / "environment.toml").read_text())


@pytest.mark.parametrize("mutate,words", [c[1:] for c in ENV_CASES], ids=[c[0] for c in ENV_CASES])
def test_environment(raw_env, mutate, words):
    broken = copy.deepcopy(raw_env)
    mutate(broken)
    with pytest.raises(SpecError) as err:
        environment_from_dict(broken, "environment.toml")
    assert _one_line(err.value, words).startswith("environment.toml: ")


@pytest.mark.parametrize("overrides,words", [c[1:] for c in JOB_CASES], ids=[c[0] for c in JOB_CASES])
def test_job(overrides, words, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(JobConfigError) as err:
        check_model(load_job_config(LOCAL_JOB.relative_to(ROOT), overrides))
    assert _one_line(err.value, words).startswith(f"{LOCAL_JOB.relative_to(ROOT)}: ")


def _data_job(tmp_path: Path, kind: str, name: str, content, extra: list[str]):
    target = tmp_path / name
    target.parent.mkdir(parents=True, exist_ok=True)
    (target.write_bytes if isinstance(content, bytes) else target.write_text)(content)
    path = target.parent if "/" in name else target
    return load_job_config(LOCAL_JOB, [f"data.kind={kind}", f"data.path={path}", *extra])


@pytest.mark.parametrize("kind,name,content,extra,words", [c[1:] for c in DATA_CASES], ids=[c[0] for c in DATA_CASES])
def test_data(tmp_path, kind, name, content, extra, words):
    job = _data_job(tmp_path, kind, name, content, extra)
    with pytest.raises(DataError) as err:
        check_data(job)
    assert _one_line(err.value, f"{LOCAL_JOB}: data.path: ", words)


@pytest.mark.subprocess  # the check loads the job's tokenizer (transformers' import starts a process)
def test_overlong_answers_are_counted_before_spend_and_refused_at_the_users_line(tmp_path):
    """An answer longer than train.seq_len: the check passed it silently (24% of a user's tokens
    were cut, said only in run.json), and ``overlong = "refuse"`` failed the run later, naming the
    uploaded copy. Now the check counts them, and refuses naming the user's file and line."""
    content = _lines([CHAT_OK], 20) + _lines([OVERLONG_CHAT], 1) + _lines([CHAT_OK], 20)
    job = _data_job(tmp_path, "chat", "c.jsonl", content, [])
    summary = check_data(job).summary
    assert "warning: 1 of 41 conversations are longer than train.seq_len 128 and will be cut to it" in summary
    refusing = _data_job(tmp_path, "chat", "c.jsonl", content, ["data.overlong=refuse"])
    with pytest.raises(DataError) as err:
        check_data(refusing)
    assert _one_line(err.value, f"{LOCAL_JOB}: data.path: {tmp_path / 'c.jsonl'}, line 21: a conversation of ",
                     "does not fit train.seq_len = 128 (1 of 41 do not; data.overlong = 'refuse'")


@pytest.mark.parametrize("config_json,extra,words", [c[1:] for c in MODEL_DIR_CASES], ids=[c[0] for c in MODEL_DIR_CASES])
def test_model_directory(tmp_path, config_json, extra, words):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(config_json)
    job = tmp_path / "job.toml"
    text = LOCAL_JOB.read_text().replace("config = {", f'path = "{model}"\n# config = {{')
    job.write_text(text.replace('tokenizer = "training/', f'tokenizer = "{ROOT}/training/'))
    with pytest.raises(JobConfigError) as err:
        check_model(load_job_config(job, extra))
    _one_line(err.value, f"{job}: ", words.format(model=model))


def plan(where: str, tmp_path: Path, text: str, capsys) -> str:
    """Plan a job file against the shipped environment at synth (charts: the error's text) or
    through ``raytrain-eks preflight`` (its one stderr line)."""
    from charts import ChartError
    from charts.jobs import plan_job
    from raytrain_eks.cli import main

    (tmp_path / "jobs").mkdir(exist_ok=True)
    path = tmp_path / "jobs" / "job.toml"
    path.write_text(text)
    with contextlib.chdir(tmp_path):
        if where == "charts":
            with pytest.raises(ChartError) as err:
                plan_job(load_environment(ROOT / "environment.toml"), path, tmp_path)
            return str(err.value)
        code = main(["preflight", "--env", str(ROOT / "environment.toml"), "--job", "jobs/job.toml",
                     "--dist", str(tmp_path / "no-dist")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    return err.strip()


@pytest.mark.parametrize("text,where,words", [c[1:] for c in PLAN_CASES], ids=[c[0] for c in PLAN_CASES])
def test_plan(tmp_path, text, where, words, capsys):
    line = plan(where, tmp_path, text, capsys)
    assert "\n" not in line and "jobs/job.toml" in line and words in line, line


def test_the_battery_has_at_least_60_bad_inputs():
    total = len(ENV_CASES) + len(JOB_CASES) + len(DATA_CASES) + len(MODEL_DIR_CASES) + len(PLAN_CASES)
    assert total >= 60, total
