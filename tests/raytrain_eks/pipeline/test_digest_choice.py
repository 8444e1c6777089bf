"""Which digest a pipeline run deploys (raytrain_eks/pipeline/digests.py): the promoted digest is
the one source of truth; only an explicit digest or one new to the pipeline overrides it."""
from __future__ import annotations

import pytest

from raytrain_eks.pipeline.digests import DigestError, choose

A, B, C = ("sha256:" + c * 64 for c in "abc")


@pytest.mark.parametrize("requested, committed, promoted, known, expected", [
    (C, A, B, True, C),          # the watcher's or an operator's explicit digest wins
    (A, B, B, True, A),          # an explicit rollback to an older digest
    ("spec", A, "", False, A),   # nothing promoted yet: the committed digest
    ("spec", "", B, False, B),   # nothing committed: the promoted one
    ("spec", A, B, True, B),     # a push with a stale commit never rolls back silently
    ("spec", C, B, False, C),    # an operator locked a digest the pipeline never saw
])
def test_choice(requested, committed, promoted, known, expected):
    assert choose(requested=requested, committed=committed, promoted=promoted,
                  known_to_pipeline=known).digest == expected


def test_nothing_to_deploy_is_one_line():
    with pytest.raises(DigestError, match="image.digest is empty and nothing was promoted yet"):
        choose(requested="spec", committed="", promoted="", known_to_pipeline=False)
