"""Session fixtures: each spec variant of charts_testspec synthesized ONCE per process
(tests/fixtures_charts.py, shared with tests/devtools)."""
from __future__ import annotations

from fixtures_charts import default_synth, large_synth  # noqa: F401
