"""Errors in the environment spec that only the infrastructure code can see."""
from __future__ import annotations

from environment import SpecError


class InfraSpecError(SpecError):
    """The spec is valid on its own but cannot be built by this CDK app (e.g. no kubectl layer
    is installed for its Kubernetes version); ``str(err)`` is the one line to print."""
