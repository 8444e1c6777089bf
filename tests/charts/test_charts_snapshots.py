"""One snapshot per chart (tests/charts/snapshots/<chart>.k8s.yaml), from the test spec.

The code archive's hash changes with every edit under training/ or jobs/, and the job-config
hash with every new field of the job-config schema (training/config.py, often edited), so they
are replaced by ``<code-hash>`` and ``<job-config-hash>`` before comparing (the targeted tests
check both values). Regenerate after an intended change:
``UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/charts/test_charts_snapshots.py``
(then read the diff before committing it).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
CHARTS = ["raycluster", "rayjob-smoke", "rayjob-smoke-on-cluster", "rayjob-finetune-qwen",
          "rayjob-finetune-qwen-on-cluster", "rayjob-local", "network-policy"]


def normalized(text: str, result) -> str:
    text = text.replace(result.code.content_hash, "<code-hash>")
    # The source tree's identity changes with every commit and edit (the targeted tests check it).
    source = result.source
    text = text.replace(source.source_hash, "<source-hash>")
    if source.git_commit:
        text = text.replace(source.git_commit, "<git-commit>")
    text = re.sub(r"(RAYTRAIN_GIT_DIRTY: |raytrain.io/git-dirty: )['\"]?(true|false)['\"]?", r"\1<git-dirty>", text)
    for digest in result.manifest_hashes.values():
        text = text.replace(digest, "<manifest-hash>")
    for plan in result.plans:
        text = text.replace(plan.config_hash, "<job-config-hash>")
    return text


def test_every_chart_has_a_snapshot(default_synth):
    assert sorted(default_synth.result.files) == sorted(CHARTS)


@pytest.mark.parametrize("chart", CHARTS)
def test_chart_matches_its_snapshot(default_synth, chart):
    actual = normalized(default_synth.result.files[chart].read_text(), default_synth.result)
    assert "<code-hash>" in actual or chart in ("raycluster", "network-policy")
    snapshot = SNAPSHOTS / f"{chart}.k8s.yaml"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        snapshot.write_text(actual)
    assert snapshot.is_file(), f"no snapshot {snapshot}: run with UPDATE_SNAPSHOTS=1"
    assert actual == snapshot.read_text(), f"{chart} changed: check the diff, then UPDATE_SNAPSHOTS=1"
