"""Which digest a pipeline run deploys: ONE source of truth, the promoted digest (SSM).

A push carries no digest (``IMAGE_DIGEST=spec``). Deploying the digest committed in
environment.toml would silently undo every automatic promotion since the last commit, so a push
deploys the PROMOTED digest. The committed one wins only when it is new to the pipeline (an
operator locked a digest the pipeline never saw: it is proven by smoke before promotion) or
before the first promotion. Going back to an older digest takes an explicit run with
``IMAGE_DIGEST=sha256:<previous>`` (the rollback command, README).
"""
from __future__ import annotations

from dataclasses import dataclass

FROM_SPEC = "spec"
"""The pipeline variable's default: no explicit digest (a push)."""


class DigestError(ValueError):
    """No digest can be deployed; one line."""


@dataclass(frozen=True, slots=True)
class Choice:
    digest: str
    reason: str


def choose(*, requested: str, committed: str, promoted: str, known_to_pipeline: bool) -> Choice:
    """The digest to deploy (pure). ``known_to_pipeline``: the history holds ``committed``."""
    if requested and requested != FROM_SPEC:
        return Choice(requested, "explicit IMAGE_DIGEST of this run (watcher or rollback)")
    if not promoted:
        if not committed:
            raise DigestError("image.digest is empty and nothing was promoted yet: run "
                              "raytrain-eks lock and commit, or start the pipeline with IMAGE_DIGEST")
        return Choice(committed, "committed in environment.toml (nothing promoted yet)")
    if committed in ("", promoted):
        return Choice(promoted, "the promoted digest")
    if known_to_pipeline:
        return Choice(promoted, f"the promoted digest: environment.toml's {committed} was already handled "
                                "by the pipeline, so deploying it would be a silent rollback (roll back "
                                f"explicitly with IMAGE_DIGEST={committed})")
    return Choice(committed, "committed in environment.toml and new to the pipeline")
