"""The kubectl/helm Lambda layer that matches the cluster's Kubernetes version.

The kubectl provider runs ``kubectl`` and ``helm`` against the cluster; its client should match
the server's minor version. Each layer is a separate PyPI package
(``aws-cdk.lambda-layer-kubectl-v3x``); only the ones pinned in pyproject.toml are installed, so
a version without one is refused up front instead of failing deep inside a synth.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

from aws_cdk import aws_lambda
from constructs import Construct

from infra.errors import InfraSpecError
from environment import Environment

# Kubernetes minor version -> (module, class). Add a line (and pin the PyPI package) per layer.
KUBECTL_LAYERS: dict[str, tuple[str, str]] = {
    "1.36": ("aws_cdk.lambda_layer_kubectl_v36", "KubectlV36Layer"),
}


def kubectl_layer_factory(env: Environment) -> Callable[[Construct, str], aws_lambda.ILayerVersion]:
    """Return the constructor of the layer for ``env``'s Kubernetes version, or raise
    :class:`InfraSpecError` (one line) when none is installed."""
    version = env.cluster.kubernetes_version
    known = ", ".join(sorted(KUBECTL_LAYERS))
    if version not in KUBECTL_LAYERS:
        raise InfraSpecError(
            f"{env.source}: cluster.kubernetes_version: {version!r} has no matching kubectl layer "
            f"in this CDK app (supported: {known}; pin aws-cdk.lambda-layer-kubectl-v"
            f"{version.replace('1.', '')} and add it to infra/kubectl_layer.py)")
    module_name, class_name = KUBECTL_LAYERS[version]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise InfraSpecError(
            f"{env.source}: cluster.kubernetes_version: {version!r} needs the Python package "
            f"{module_name.replace('_', '-').replace('aws-cdk-', 'aws-cdk.', 1)}, which is not installed "
            "(run make install)") from None
    return getattr(module, class_name)
