"""A new digest changes ONLY the image references (and what records them) in the manifests.

The pipeline's Synth stage runs ``raytrain-eks lock --digest`` and then ``cdk8s synth``; this
test does the same with charts/main.py's ``synth`` on two digests and diffs the output line by
line. Every changed line must become the new line by replacing the old digest with the new one
(and the old spec hash with the new one: the spec hash covers the digest). Nothing else moves:
not the code archive, not a resource, not a name. Rolling back (``lock --digest <old>``) gives
the old spec back byte for byte, so it synthesizes the old manifests.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from charts.main import synth
from raytrain_eks.commands.lock import lock
from spec import load_environment

REPO = Path(__file__).resolve().parents[2]
OLD = "sha256:" + "0123456789abcdef" * 4
NEW = "sha256:" + "fedcba9876543210" * 4


def snapshot(tmp_path: Path) -> Path:
    """The folders synth reads (jobs/ and the training/ code it bundles), copied once: both
    synths see the same code even while someone edits the working tree."""
    root = tmp_path / "repo"
    for folder in ("training", "jobs"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_new_digest_changes_only_image_references(tmp_path):
    root = snapshot(tmp_path)
    # given the repository's spec pinned to OLD, synthesized
    spec_file = tmp_path / "environment.toml"
    shutil.copy(REPO / "environment.toml", spec_file)
    lock(str(spec_file), digest=OLD)
    old_text = spec_file.read_bytes()
    old_env = load_environment(spec_file)
    before = synth(old_env, tmp_path / "old", root=root)
    # when the pipeline locks NEW and synthesizes again
    assert lock(str(spec_file), digest=NEW) == (OLD, NEW)
    new_env = load_environment(spec_file)
    after = synth(new_env, tmp_path / "new", root=root)

    # then the same files, the same code archive
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
            # and each changed line is the old one with the digest (and the spec hash) swapped
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
    assert lock(str(spec_file), digest=OLD) == (NEW, OLD)
    assert spec_file.read_bytes() == old_text
