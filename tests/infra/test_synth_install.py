"""The pipeline's Synth build installs only what it needs: the ``synth`` extra (environment,
infra, charts and their tests), never torch, Ray or transformers; the kubectl builds' ``pipeline``
extra neither. Proven on pyproject.toml's own extras and by importing the code those builds run
with the heavy packages made unimportable."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "transformers")


def closure(extra: str) -> set[str]:
    """Package names an extra installs, following ``raytrain-eks[...]`` self-references."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras, names, todo = project["optional-dependencies"], set(), [extra]
    names |= {re.split(r"[\[=<>~ ]", d)[0].lower() for d in project["dependencies"]}
    while todo:
        for requirement in extras[todo.pop()]:
            name = re.split(r"[\[=<>~ ]", requirement)[0].lower()
            if name == project["name"]:
                todo += re.search(r"\[(.*)\]", requirement).group(1).split(",")
            else:
                names.add(name)
    return names


def test_synth_and_pipeline_extras_hold_no_torch_ray_or_transformers():
    assert not closure("synth") & set(HEAVY)
    assert not closure("pipeline") & set(HEAVY)
    assert set(HEAVY) <= closure("dev")  # the local suite still trains


def test_what_synth_and_the_pipeline_steps_run_imports_without_torch_or_ray():
    probe = f"""
import importlib, pkgutil, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {HEAVY!r}:
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
import charts, environment, infra, raytrain_eks.pipeline
for package in (charts, environment, infra, raytrain_eks.pipeline):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if ".imports." not in module.name:
            importlib.import_module(module.name)
import charts.main, raytrain_eks.cli, raytrain_eks.verify.lock, raytrain_eks.runs.report
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_synth_build_test_selection_collects_without_torch_or_ray():
    """Every test module the Synth build runs imports with torch, Ray and transformers absent."""
    from infra.stacks.pipeline_builds import SYNTH_TESTS

    probe = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {HEAVY!r}:
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
import pytest
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not slow", *{SYNTH_TESTS.split()!r}]))
"""
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout[-3000:]
    assert "error" not in done.stdout.splitlines()[-1].lower()
