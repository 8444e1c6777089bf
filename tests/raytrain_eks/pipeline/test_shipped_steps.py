"""The kubectl builds' steps in their shipped form: what CodeBuild has when the Smoke, Apply and
Promote buildspecs run ``python -m raytrain_eks.pipeline STEP`` (infra/stacks/pipeline_builds.py):
the repository's files as the Synth output artifact carries them (with ``dist/``), installed
with ``pip install -e '.[pipeline]'`` into a Python that holds only the ``pipeline`` extra's
distributions (pyproject.toml) and what they require: no torch, Ray, aws-cdk, cdk8s, pytest or
moto. The editable install maps the clone onto ``sys.path`` (here: a ``.pth`` file, as
setuptools' editable install writes one).

Each step must get as far as its first kubectl or AWS call, with no import error before it: a
``kubectl`` on PATH records its calls (and fails), and AWS points at a closed port.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from bare_runtime import _clean_environ, make_runtime, visible_project_packages

from charts.main import synth
from environment import load_environment
from raytrain_eks.verify.lock import lock

REPO = Path(__file__).resolve().parents[3]
DIGEST = "sha256:" + "7" * 64
NO_IMPORT_ERROR = re.compile(r"ModuleNotFoundError|ImportError|No module named")


def pipeline_distributions() -> tuple[str, ...]:
    """The ``pipeline`` extra's distribution names, from pyproject.toml (the buildspec's install)."""
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["pipeline"]
    return tuple(re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0] for requirement in extra)


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """The CodeBuild workspace of a kubectl build: the committed files (git ls-files), a spec
    locked to the run's digest and the manifests synthesized from it, as Synth leaves them."""
    root = tmp_path_factory.mktemp("codebuild")
    clone = root / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        source = REPO / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    lock(str(clone / "environment.toml"), digest=DIGEST)
    synth(load_environment(clone / "environment.toml"), clone / "dist", root=clone)
    (clone / "dist" / "pipeline-run.json").write_text(f'{{"digest": "{DIGEST}", "promoted_at_synth": ""}}\n')
    python = make_runtime(root / "venv", pipeline_distributions())
    assert visible_project_packages(python, root) == []  # the bare runtime holds none of the project
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "__editable__.raytrain_eks.pth").write_text(f"{clone}\n")  # pip install -e .
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{root}/kubectl-calls"\n'
                                     'echo "no cluster here" >&2\nexit 1\n')
    (bin_dir / "kubectl").chmod(0o755)
    return python, clone, root


@pytest.mark.parametrize("step, args, reaches", [
    ("smoke", ["--digest", DIGEST], "kubectl"),
    ("gate", ["--digest", DIGEST, "--record", "s3://bucket/runs/smoke-exec-1-1/run.json?versionId=v1"], "aws"),
    ("apply", ["--digest", DIGEST], "aws"),
    ("promote", ["--digest", DIGEST, "--record", "s3://bucket/runs/smoke-exec-1-1/run.json?versionId=v1"], "aws"),
    ("rollback", ["--digest", DIGEST, "--reason", "test"], "aws"),
    ("hold", ["--template", "cdk.out/raytrain-cluster.template.json"], "aws"),
])
def test_each_kubectl_step_runs_in_the_shipped_runtime_up_to_its_first_call(build, step, args, reaches):
    python, clone, root = build
    calls = root / "kubectl-calls"
    calls.unlink(missing_ok=True)
    env = _clean_environ() | {
        "PATH": f"{root / 'bin'}:{_clean_environ()['PATH']}", "EXECUTION_ID": "exec-1", "CODEBUILD_BUILD_NUMBER": "1",
        "HISTORY_TABLE": "history", "PROMOTED_DIGEST_PARAMETER": "/raytrain/promoted", "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1", "POLL_SECONDS": "0"}
    done = subprocess.run([str(python), "-m", "raytrain_eks.pipeline", step, *args], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=300)
    assert not NO_IMPORT_ERROR.search(done.stderr), done.stderr
    if reaches == "kubectl":
        assert calls.read_text().startswith("-n ray delete rayjob smoke "), done.stderr  # its first call
    else:
        assert "Could not connect to the endpoint URL" in done.stderr, done.stderr
    assert done.returncode == 1  # a failure, recorded as far as it can be: never a crash
