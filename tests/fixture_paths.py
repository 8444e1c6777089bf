"""Where the tests' own inputs live (a plain module with a unique name, imported by bare name)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_JOBS = ROOT / "tests" / "fixtures" / "jobs"
"""Copies of the shipped jobs the tests start from: editing a shipped job (a product, tested
as one in tests/test_shipped_jobs.py: it loads, passes --check, synthesizes) changes no test's input."""
