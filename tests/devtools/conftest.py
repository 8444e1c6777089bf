"""The chart tests' synthesized app (tests/fixtures_charts.py), for the before/after oracle's test."""
from __future__ import annotations

from fixtures_charts import default_synth  # noqa: F401
