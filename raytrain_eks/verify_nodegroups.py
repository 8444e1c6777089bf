"""The node-group check of `raytrain-eks verify` (see :mod:`raytrain_eks.verify`): which of the
spec's GPU node groups already exist, so that the deploy writes a desired size only for a group
it creates (infra/verify_gate.py says why). Read-only: EKS DescribeCluster, ListNodegroups
and DescribeNodegroup on the spec's cluster; no cluster yet means no group exists.
"""
from __future__ import annotations

from environment import Environment
from infra.verify_gate import autoscaled, creation_key, existing
from raytrain_eks.verify import Finding, passed


def node_group_tags(eks, cluster: str) -> list[dict[str, str]]:
    """The tags of every node group of ``cluster`` ([] when the cluster does not exist)."""
    try:
        eks.describe_cluster(name=cluster)
    except eks.exceptions.ResourceNotFoundException:
        return []
    names: list[str] = []
    page = eks.list_nodegroups(clusterName=cluster)
    while True:
        names += page["nodegroups"]
        if not page.get("nextToken"):
            break
        page = eks.list_nodegroups(clusterName=cluster, nextToken=page["nextToken"])
    return [eks.describe_nodegroup(clusterName=cluster, nodegroupName=n)["nodegroup"].get("tags") or {}
            for n in names]


def check_node_groups(env: Environment, eks, found: set[str]) -> list[Finding]:
    """One line per GPU group: updated in place (its size left alone) or created at min_nodes.
    Adds the existing groups' names to ``found`` (what the pass records)."""
    found |= existing(env, node_group_tags(eks, env.cluster.eks_name))
    az, zones = env.cluster.gpu_availability_zone, env.cluster.availability_zones
    out = []
    for g in env.gpu_node_groups:
        if g.existing:  # the existing cluster's own group: raytrain_eks/verify_existing.py checks it
            continue
        if g.name in found:
            size = "its running size left to cluster-autoscaler" if autoscaled(g) else f"sized {g.min_nodes}"
            out.append(passed("node-groups", f"group {g.name} exists ({creation_key(g, az, zones)}): a deploy updates it, {size}"))
        else:
            out.append(passed("node-groups", f"group {g.name} ({creation_key(g, az, zones)}) does not exist yet: "
                                             f"a deploy creates it with {g.min_nodes} node(s)"))
    return out
