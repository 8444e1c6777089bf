"""A new digest changes ONLY the image references (and what records them) in the manifests.

The pipeline's Synth stage runs ``raytrain-eks lock --digest`` and then ``cdk8s synth``; this
test does the same with charts/main.py's ``synth`` on two digests and diffs the output line by
line. Every changed line must become the new line by replacing the old digest with the new one
(and the old spec hash with the new one: the spec hash covers the digest). Nothing else moves:
not the code archive, not a resource, not a name. Rolling back (``lock --digest <old>``) gives
the old spec back byte for byte, so it synthesizes the old manifests.
"""
from __future__ import annotations

import base64

import json
import os
import re
import shlex
import shutil
import subprocess
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from training import contract

from charts.main import synth
from raytrain_eks.verify.lock import lock
from environment import load_environment
from fixture_paths import FIXTURE_JOBS

REPO = Path(__file__).resolve().parents[3]
OLD = "sha256:" + "0123456789abcdef" * 4
NEW = "sha256:" + "fedcba9876543210" * 4


def snapshot(tmp_path: Path) -> Path:
    """The folders synth reads (jobs/ and the training/ code it bundles), copied once: both
    synths see the same code even while someone edits the working tree. jobs/ are the fixture copies."""
    root = tmp_path / "repo"
    for folder in contract.CODE_DIRS:
        source = FIXTURE_JOBS if folder == contract.JOBS_DIR else REPO / folder
        shutil.copytree(source, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture(scope="module")
def two_synths(tmp_path_factory):
    """The spec pinned to OLD and synthesized; then locked to NEW (as the Synth stage does) and
    synthesized again. Both read the same snapshot of jobs/ and training/."""
    tmp_path = tmp_path_factory.mktemp("digest-diff")
    root = snapshot(tmp_path)
    spec_file = tmp_path / "environment.toml"
    shutil.copy(REPO / "environment.toml", spec_file)
    lock(str(spec_file), digest=OLD)
    old_text = spec_file.read_bytes()
    old_env = load_environment(spec_file)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        before = synth(old_env, tmp_path / "old", root=root)
        assert lock(str(spec_file), digest=NEW) == (OLD, NEW)
        new_env = load_environment(spec_file)
        after = synth(new_env, tmp_path / "new", root=root)
    return SimpleNamespace(root=root, spec_file=spec_file, old_text=old_text, old_env=old_env,
                           new_env=new_env, before=before, after=after)


def test_new_digest_changes_only_image_references(two_synths):
    t = two_synths
    before, after, old_env, new_env = t.before, t.after, t.old_env, t.new_env
    # the same files, the same code archive
    assert list(before.files) == list(after.files)
    assert before.code.content_hash == after.code.content_hash
    for chart, old_path in before.files.items():
        old_lines = old_path.read_text().splitlines()
        new_lines = after.files[chart].read_text().splitlines()
        assert len(old_lines) == len(new_lines), chart
        for old_line, new_line in zip(old_lines, new_lines):
            if old_line == new_line:
                assert OLD not in new_line
                continue
            key, _, old_value = old_line.strip().partition(": ")
            if key == contract.ENV_MANIFEST_HASH:  # the hash of the manifest it sits in
                assert new_line.strip().partition(": ")[2] != old_value
                continue
            if key == contract.ENV_SPEC_TEXT:  # the spec's text, base64: the same text, new digest
                decode = lambda line: base64.b64decode(line.strip().partition(": ")[2]).decode()  # noqa: E731
                assert decode(old_line).replace(OLD, NEW) == decode(new_line), chart
                continue
            # each changed line is the old one with the digest (and the spec hash) swapped
            assert OLD in old_line or old_env.spec_hash in old_line, (chart, old_line)
            assert old_line.replace(OLD, NEW).replace(old_env.spec_hash, new_env.spec_hash) == new_line, \
                (chart, old_line, new_line)
        assert OLD not in after.files[chart].read_text()
    # every container of every pod template (RayCluster head + workers, each RayJob's own
    # cluster) runs the new digest
    images = {chart: re.findall(r"^\s*(?:- )?image: (\S+)$", path.read_text(), re.M)
              for chart, path in after.files.items()}
    assert len(images["raycluster"]) >= 2
    assert {image for found in images.values() for image in found} == {f"{new_env.image.repository}@{NEW}"}

    # rollback: pinning the previous digest restores the previous spec exactly
    assert lock(str(t.spec_file), digest=OLD) == (NEW, OLD)
    assert t.spec_file.read_bytes() == t.old_text


def test_smoke_step_gives_each_execution_its_own_run(two_synths):
    """The Smoke step's own code on the real synthesized manifests: the job of this digest runs
    on a cluster of its own, the previous digest's manifest is refused, and the job (through its
    own config parser) sees a run name unique to the execution."""
    from raytrain_eks.pipeline import StepContext
    from raytrain_eks.pipeline.smoke import SmokeFailed, smoke_job
    from training.config import load_job_config

    t = two_synths
    execution = "3f1d2c4b-5a69-4e7f-8d0c-1b2a3c4d5e6f"
    ctx = StepContext(env=t.new_env, dist=t.after.files["raycluster"].parent, kube=None, s3=None, ssm=None,
                      history=None, parameter_name="", execution_id=execution)
    job = smoke_job(ctx, NEW)
    assert "clusterSelector" not in job["spec"] and "rayClusterSpec" in job["spec"]
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["image"].endswith("@" + NEW)
    with pytest.raises(SmokeFailed, match="synthesized for"):
        smoke_job(ctx, OLD)
    argv = shlex.split(job["spec"]["entrypoint"])
    overrides = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--set"]
    config = load_job_config(t.root / argv[argv.index("--config") + 1], overrides)
    assert config.run_name == f"smoke-{execution}-1"  # build 1 of the execution (CODEBUILD_BUILD_NUMBER)
    assert config.evidence.require_transport == "efa"
