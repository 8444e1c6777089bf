"""The repository's spec template, whatever a deployment has committed over it.

Tests that assume the template (no account, nobody admitted, no pipeline, no locked digest)
build their spec from ``template_raw()``, not from environment.toml as committed: the pipeline's
Synth build runs them on a deployable, locked spec (scripts/pipeline/local_synth.py shows it).
"""
from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

DEPLOYMENT_FIELDS = {
    ("cluster", "account"): "",
    ("cluster", "admin_principal_arns"): [],
    ("image", "digest"): "",
    ("pipeline", "connection_arn"): "",
    ("pipeline", "repository"): "",
}
"""What a deployment fills in (the template comments in environment.toml say how), at the
template's values: empty."""


def template_raw() -> dict:
    """environment.toml with every field of ``DEPLOYMENT_FIELDS`` back at its template value."""
    raw = tomllib.loads((REPO / "environment.toml").read_text())
    for (section, key), value in DEPLOYMENT_FIELDS.items():
        raw.setdefault(section, {})[key] = value
    return raw
