"""The Deploy build's record of which GPU node groups exist, written just before ``cdk deploy``.

The pipeline deploys with ``-c raytrain:skip-verify=true`` (its gate is its own checks); without
a record app.py writes every autoscaled group's DesiredSize, and that update resets the running
GPU nodes to it (infra/existing_groups.py). So the Deploy build runs the same node-group lookup
`raytrain-eks verify` does (raytrain_eks/verify_account.py: EKS DescribeCluster,
ListNodegroups, DescribeNodegroup) and writes it where app.py reads it (infra/verify_gate.py).
It runs in the Release stage, under its lock: no other execution creates a group in between.
"""
from __future__ import annotations

from pathlib import Path

from environment import Environment
from infra import verify_gate
from infra.existing_groups import existing
from raytrain_eks.verify_account import node_group_tags


def record(env: Environment, root: Path, eks, account: str) -> frozenset[str]:
    """Write the record of ``env``'s existing GPU groups under ``root``; returns them."""
    found = existing(env, node_group_tags(eks, env.cluster.name))
    path = verify_gate.stamp_path(root, env)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(verify_gate.stamp(env, account, verify_gate.now(), found))
    return found
