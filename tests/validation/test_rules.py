"""The shared rules accept what AWS and transformers accept, and every entry point ends a bad
input with ONE line and exit 2 (no traceback, no JSII stack)."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cases import LOCAL_JOB, OPTIM_CASES
from environment.rules import bucket_name_problem, ray_version_in_tag, schedule_problem, tag_ray_problem

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("expression", [
    "rate(1 minute)", "rate(5 minutes)", "rate(1 hour)", "rate(6 hours)", "rate(1 day)", "rate(7 days)",
    "cron(0 12 * * ? *)", "cron(0/15 * ? * MON-FRI *)", "cron(0 8 1 * ? *)", "cron(30 2 ? * 2#1 2026-2030)",
    "cron(0 */6 * * ? *)", "cron(15 10 L * ? *)",
])
def test_eventbridge_schedules_that_deploy_are_accepted(expression):
    assert schedule_problem(expression) == ""


@pytest.mark.parametrize("name", ["my-ckpts", "a.b.c", "raytrain-raytrain-111122223333-us-east-1", "abc", "a" * 63])
def test_valid_bucket_names_are_accepted(name):
    assert bucket_name_problem(name) == ""


def test_the_ray_an_image_tag_names():
    assert ray_version_in_tag("train-ml-cuda-v1.1.0") == ""  # the DLC's own release
    assert ray_version_in_tag("2.58.0-py313-cu128") == "2.58.0"
    assert ray_version_in_tag("ray-2.58") == "2.58"
    assert tag_ray_problem("ray-2.58", "2.58.0") == "" and tag_ray_problem("2.58.0", "2.58.0") == ""
    assert tag_ray_problem("2.57.1-py313", "2.58.0").startswith("names Ray 2.57.1")


def test_model_config_keys_are_exactly_what_qwen2config_takes():
    transformers = pytest.importorskip("transformers")
    from training.model_config import QWEN2_CONFIG_KEYS

    takes = {p for p in inspect.signature(transformers.Qwen2Config.__init__).parameters if p not in ("self", "kwargs")}
    assert QWEN2_CONFIG_KEYS == takes


def test_kubectl_layers_are_the_spec_versions():
    pytest.importorskip("aws_cdk")
    from environment.contract import KUBERNETES_VERSIONS
    from infra.build import KUBECTL_LAYERS

    assert tuple(KUBECTL_LAYERS) == KUBERNETES_VERSIONS


def test_preflight_of_a_local_job_does_not_depend_on_this_machine(monkeypatch):
    from environment import load_environment
    from raytrain_eks.planning.preflight import run_preflight
    from training.config import load_job_config

    monkeypatch.chdir(ROOT)
    env = load_environment(ROOT / "environment.toml")
    job = load_job_config(LOCAL_JOB)
    verdicts = []
    for cpus in (1, 2, 96):
        monkeypatch.setattr(os, "cpu_count", lambda cpus=cpus: cpus)
        plan = run_preflight(env, job, dist_dir="/nonexistent", installed_ray="2.58.0")
        verdicts.append((plan.refusal, [(c.name, c.ok) for c in plan.checks]))
    assert verdicts[0] == verdicts[1] == verdicts[2] and verdicts[0][0] is None


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def _bad_env(tmp_path: Path) -> Path:
    text = (ROOT / "environment.toml").read_text().replace('watch_schedule = "rate(6 hours)"',
                                                           'watch_schedule = "rate(1 hours)"')
    path = tmp_path / "environment.toml"
    path.write_text(text)
    return path


def _assert_one_line(out: subprocess.CompletedProcess, *words: str) -> None:
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    for w in words:
        assert w in lines[0], lines[0]


def test_entry_points_end_a_bad_spec_with_one_line(tmp_path):
    env = _bad_env(tmp_path)
    words = ("pipeline.watch_schedule: 'rate(1 hours)'",)
    _assert_one_line(_run(["-m", "raytrain_eks.cli", "summary", "--env", str(env)]), *words)
    _assert_one_line(_run(["-m", "raytrain_eks.cli", "preflight", "--env", str(env), "--job", str(LOCAL_JOB)]), *words)
    _assert_one_line(_run(["-m", "charts.main", "--env", str(env), "--outdir", str(tmp_path / "dist")]), *words)
    assert not (tmp_path / "dist").exists()


@pytest.mark.skipif(not (ROOT / "node_modules").exists(), reason="npm tools not installed (make install)")
def test_cdk_app_ends_a_bad_spec_with_one_line_and_no_jsii_stack(tmp_path):
    env = _bad_env(tmp_path)
    text = env.read_text().replace('name = "raytrain"', 'name = "' + "a" * 40 + '"').replace(
        'account = ""', 'account = "111122223333"')
    env.write_text(text.replace("rate(1 hours)", "rate(6 hours)"))
    out = _run(["app.py"], ENV_FILE=str(env), CDK_OUTDIR=str(tmp_path / "cdk.out"),
               JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20")
    # valid for the spec, but nobody could run kubectl on the cluster: the CDK app refuses
    _assert_one_line(out, "cluster.admin_principal_arns: [] names nobody who may run kubectl")
    assert "jsii" not in out.stderr.lower()


def test_job_entry_points_end_bad_input_with_one_line(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text(LOCAL_JOB.read_text().replace("[train]", "[train"))
    _assert_one_line(_run(["-m", "raytrain_eks.cli", "preflight", "--job", str(broken)]), f"{broken}: not valid TOML")
    _assert_one_line(_run(["-m", "training", "--config", str(broken), "--check"]), f"{broken}: not valid TOML")
    for not_a_job in ("jobs", "/bin/ls"):
        _assert_one_line(_run(["-m", "training", "--config", not_a_job, "--check"]), f"{not_a_job}: ")
        _assert_one_line(_run(["-m", "raytrain_eks.cli", "preflight", "--job", not_a_job]), f"{not_a_job}: ")
        _assert_one_line(_run(["-m", "raytrain_eks.cli", "summary", "--env", not_a_job]), f"{not_a_job}: ")
    _assert_one_line(_run(["-m", "training", "--config", str(LOCAL_JOB), "--check",
                           "--set", "model.config.num_hidden_layer=2"]),
                     "model.config.num_hidden_layer: 'num_hidden_layer' is not a known Qwen2Config key (known: ")
    _assert_one_line(_run(["-m", "training", "--config", str(LOCAL_JOB), "--check",
                           "--set", "model.config.num_hidden_layer=2"]), "; did you mean 'num_hidden_layers'?)")


@pytest.mark.parametrize("overrides,words", [c[1:] for c in OPTIM_CASES], ids=[c[0] for c in OPTIM_CASES])
def test_optimizer_settings_are_refused_by_the_cli_in_one_line(overrides, words):
    """Each ``[optim]`` field's bad value through ``raytrain-eks preflight`` as a user runs it."""
    sets = [arg for item in overrides for arg in ("--set", item)]
    _assert_one_line(_run(["-m", "raytrain_eks.cli", "preflight", "--job", str(LOCAL_JOB), *sets]),
                     f"{LOCAL_JOB.relative_to(ROOT)}: {words}")
