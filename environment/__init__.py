"""The environment spec: the one place each fact about an environment lives.

Pure Python (standard library + tomllib): importable by the CDK app, the cdk8s app, the CLI and
the tests without pulling in aws_cdk, cdk8s, ray or torch (a test proves it).
"""
from environment.instances import INSTANCE_TYPES, InstanceType
from environment.model import (
    Environment, FieldError, GpuNodeGroupSpec, SpecError, UnlockedImageWarning, environment_from_dict, load_environment,
)

__all__ = [
    "INSTANCE_TYPES", "InstanceType", "FieldError", "SpecError", "environment_from_dict", "load_environment",
    "Environment", "GpuNodeGroupSpec", "UnlockedImageWarning",
]
