"""The kubectl/helm Lambda layer that matches the cluster's Kubernetes version.

The kubectl provider runs ``kubectl`` and ``helm`` against the cluster; its client should match
the server's minor version. Each layer is a separate PyPI package
(``aws-cdk.lambda-layer-kubectl-v3x``). The versions this app supports are listed ONCE, in
environment/contract.py (the spec refuses any other); this module maps each to its package.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

from aws_cdk import aws_lambda
from constructs import Construct

from environment import Environment
from environment.contract import KUBERNETES_VERSIONS
from infra.errors import InfraSpecError


def layer_module(version: str) -> tuple[str, str]:
    """``1.36`` -> (``aws_cdk.lambda_layer_kubectl_v36``, ``KubectlV36Layer``): the packages'
    naming scheme."""
    minor = version.removeprefix("1.")
    return f"aws_cdk.lambda_layer_kubectl_v{minor}", f"KubectlV{minor}Layer"


# Kubernetes minor version -> (module, class), one per supported version.
KUBECTL_LAYERS: dict[str, tuple[str, str]] = {v: layer_module(v) for v in KUBERNETES_VERSIONS}


def kubectl_layer_factory(env: Environment) -> Callable[[Construct, str], aws_lambda.ILayerVersion]:
    """Return the constructor of the layer for ``env``'s Kubernetes version, or raise
    :class:`InfraSpecError` (one line) when its package is not installed."""
    version = env.cluster.kubernetes_version
    if version not in KUBECTL_LAYERS:  # the spec refuses it first; kept for hand-built Environments
        raise InfraSpecError(
            f"{env.source}: cluster.kubernetes_version: {version!r} has no matching kubectl layer "
            f"in this CDK app (supported: {', '.join(KUBERNETES_VERSIONS)})")
    module_name, class_name = KUBECTL_LAYERS[version]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise InfraSpecError(
            f"{env.source}: cluster.kubernetes_version: {version!r} needs the Python package "
            f"{module_name.replace('_', '-').replace('aws-cdk-', 'aws-cdk.', 1)}, which is not installed "
            "(run make install)") from None
    return getattr(module, class_name)
