"""The fixtures of the CLI tests, from the plain modules that tests/infra and tests/training share:
the synthesized CDK app (the fit check's input), a real registry and moto's server (lock and the
pipeline steps), and moto's S3 with the runs bucket (report, reproduce)."""
from __future__ import annotations

from fixtures_cdk import default, existing  # noqa: F401
from fixtures_pipeline import aws, pushed, registry, spec_file  # noqa: F401
from fixtures_runs_s3 import _moto_server, moto_s3  # noqa: F401
