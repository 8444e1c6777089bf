"""The CloudFormation stack names of an environment (no aws_cdk import: the CLI reads them too)."""
from __future__ import annotations


def stack_name(cluster_name: str, part: str) -> str:
    """``raytrain`` + ``cluster`` -> ``raytrain-cluster`` (parts: network, storage, cluster, pipeline)."""
    return f"{cluster_name}-{part}"


def control_plane_log_group(cluster_name: str) -> str:
    """Where EKS writes a cluster's control-plane logs (the cluster stack creates it, with a retention)."""
    return f"/aws/eks/{cluster_name}/cluster"
