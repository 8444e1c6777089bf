"""The fixtures of the infra tests, from the plain modules that tests/raytrain_eks shares: the CDK
app synthesized per spec variant (fixtures_cdk.py) and, for the image watcher Lambda, a real
registry and moto's server (fixtures_pipeline.py)."""
from __future__ import annotations

from fixtures_cdk import alternative, capacity, default, existing, variant  # noqa: F401
from fixtures_pipeline import aws, pushed, registry  # noqa: F401
