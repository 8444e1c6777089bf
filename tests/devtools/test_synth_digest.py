"""The before/after oracle (devtools/synth_digest.py) on the chart tests' own synth: what it
normalizes is exactly what another commit of the same manifests changes (the code archive's hash,
the source hash, the git commit and dirty flag, the manifest hash), and nothing else: a change of
anything a deploy runs (here the image digest) still changes the digest."""
from __future__ import annotations

import re

import pytest

from environment.contract import GIT_COMMIT_LABEL, GIT_DIRTY_LABEL
from training import contract


def _as_another_commit(text: str, result) -> tuple[str, str, object]:
    """The manifest as a synth of other code on another commit writes it, with that synth's code
    hash and source identity: each value that follows the code replaced where the charts write it
    (the labels, the RayJob's env_vars, the URIs)."""
    import dataclasses

    source = result.source
    text = text.replace(result.code.content_hash, "f" * 16).replace(source.source_hash, "e" * len(source.source_hash))
    text = text.replace(source.source_hash[:contract.LABEL_HASH_CHARS], "e" * contract.LABEL_HASH_CHARS)
    if source.git_commit:
        text = text.replace(source.git_commit, "d" * 40)
    flip = {"true": "false", "false": "true"}
    text = re.sub(rf"({re.escape(GIT_DIRTY_LABEL)}: \")(true|false)\"", lambda m: f"{m[1]}{flip[m[2]]}\"", text)
    text = re.sub(rf"({contract.ENV_GIT_DIRTY}: ')(true|false)'", lambda m: f"{m[1]}{flip[m[2]]}'", text)
    text = re.sub(rf"({contract.ENV_MANIFEST_HASH}: )sha256:[0-9a-f]{{64}}", r"\1sha256:" + "c" * 64, text)
    other = dataclasses.replace(source, source_hash="e" * len(source.source_hash),
                                git_commit="d" * 40 if source.git_commit else "", dirty=not source.dirty)
    return text, "f" * 16, other


@pytest.mark.synth
def test_the_oracle_normalizes_what_follows_the_code_and_nothing_else(default_synth):
    from devtools.synth_digest import chart_lines, normalize

    result = default_synth.result
    lines = chart_lines("default", result)
    assert sorted(line.split()[0] for line in lines) == sorted(
        [f"charts/default/{path.name}" for path in result.files.values()] + ["charts/default/code/training-<code-hash>.zip"])
    rayjobs = [path.read_text() for name, path in result.files.items() if name.startswith("rayjob-")]
    assert rayjobs
    for text in rayjobs:
        other, code_hash, source = _as_another_commit(text, result)
        assert other != text  # each RayJob carries the values that follow the code ...
        ours = normalize(text, code_hash=result.code.content_hash, source=result.source)
        assert normalize(other, code_hash=code_hash, source=source) == ours  # ... each named
        assert GIT_COMMIT_LABEL in ours and "<code-hash>" in ours and "<manifest-hash>" in ours
        # what a deploy runs is never normalized away: another image digest is another digest
        digest = re.search(r"sha256:[0-9a-f]{64}", ours)[0]
        moved = normalize(text.replace(digest, "sha256:" + "b" * 64), code_hash=result.code.content_hash,
                          source=result.source)
        assert moved != ours
