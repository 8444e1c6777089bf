"""The deploy gate: ``cdk deploy`` of the cluster stack needs a passing ``raytrain-eks verify``
of the same spec and account, made recently; and which GPU node groups that verify found.

A passing verify writes a stamp, :func:`stamp_path` (``.work/verify/<spec hash>.json``: the
account, the time and which GPU node groups exist); app.py reads it and, without a fresh one, the cluster stack carries a
CloudFormation rule that always fails. ``cdk synth`` (and ``make demo``) is unaffected; a
deploy is refused when CloudFormation validates the template, before it changes anything, with
the rule's one line and its fix. ``-c raytrain:skip-verify=true`` is the explicit override.

Which of the spec's GPU node groups already exist: only those may deploy without a desired size.
CloudFormation must CREATE an ``AWS::EKS::Nodegroup`` with its whole scaling config ("When
creating a node group, you must specify all or none of the properties": EKS API Reference,
NodegroupScalingConfig, and the CloudFormation ``AWS::EKS::Nodegroup ScalingConfig`` page),
but an UPDATE that carries DesiredSize resets the running size to it, and one without it leaves
that size alone ("When using CloudFormation, no action occurs if you remove this parameter from
your CFN template", same EKS page, desiredSize). So an autoscaled group's template has a desired
size exactly when the deploy creates the group: `raytrain-eks verify` finds the spec's groups
(EKS DescribeNodegroup, by :data:`GROUP_TAG`), the deploy gate's record carries their names, and
app.py hands them to ``build_app``.

A group whose create-only inputs changed is replaced, which is a creation: it counts as
existing only while its :func:`creation_key` (instance type, capacity, GPU AZ and the AZ list,
AMI type: the inputs of the schema's createOnlyProperties) is the one
its running node group is tagged with.

Stdlib only (the CLI writes the stamp and finds the groups with these functions, without
aws_cdk); app.py does the file reading.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from pathlib import Path

from environment import Environment, GpuNodeGroupSpec

MAX_AGE = timedelta(hours=24)
"""How long a passing verify counts: long enough for a deploy session, short enough that an
add-on pin EKS has since withdrawn or a quota since lowered is seen again."""
SKIP_CONTEXT = "raytrain:skip-verify"
"""The context key of the explicit override (``cdk deploy -c raytrain:skip-verify=true``)."""


def stamp_path(root: Path, env: Environment) -> Path:
    """Where a passing verify of ``env`` is recorded (one file per spec hash)."""
    return root / ".work" / "verify" / f"{env.spec_hash}.json"


def stamp(env: Environment, account: str, now: datetime, existing_gpu_groups: frozenset[str] = frozenset()) -> str:
    """The stamp's text for a verify of ``env`` that passed with credentials of ``account`` and
    found ``existing_gpu_groups`` deployed."""
    return json.dumps({"spec_hash": env.spec_hash, "account": account, "passed_at": now.isoformat(),
                       "existing_gpu_groups": sorted(existing_gpu_groups)})


def recorded_groups(recorded: str) -> frozenset[str] | None:
    """The GPU groups a stamp found deployed (None: a stamp that did not look)."""
    groups = json.loads(recorded).get("existing_gpu_groups")
    return None if groups is None else frozenset(groups)


def refusal(env: Environment, recorded: str | None, now: datetime, deploying_account: str = "") -> str | None:
    """Why the cluster stack may not be deployed (None: it may). ``recorded``: the stamp's
    text, if any; ``deploying_account``: the credentials' account when the CDK CLI knows it
    (CDK_DEFAULT_ACCOUNT), else the spec's."""
    fix = (f"run `raytrain-eks verify --env {env.source}` and deploy again "
           f"(or deploy with -c {SKIP_CONTEXT}=true to skip it)")
    if recorded is None:
        return f"{env.source}: no passing `raytrain-eks verify` of this spec (hash {env.spec_hash}): {fix}"
    record = json.loads(recorded)
    age = now - datetime.fromisoformat(record["passed_at"])
    if age > MAX_AGE:
        return (f"{env.source}: the last passing `raytrain-eks verify` of this spec is {age.total_seconds() / 3600:.0f} h "
                f"old (at most {MAX_AGE.total_seconds() / 3600:.0f} h): {fix}")
    account = deploying_account or env.cluster.account
    if account and record["account"] != account:
        return (f"{env.source}: `raytrain-eks verify` passed for account {record['account']}, this deploy is for "
                f"account {account}: {fix}")
    return None


def now() -> datetime:
    """The current time, in UTC (the stamp's zone)."""
    return datetime.now(timezone.utc)


# --- Which GPU node groups exist (the module docstring says why) -------------------------------

GROUP_TAG = "raytrain:gpu-node-group"
"""The node group's tag naming its ``[[gpu_node_groups]]`` entry (CloudFormation generates the
node group's own name, so the name cannot say it)."""
CREATION_TAG = "raytrain:creation-key"
"""The node group's tag holding :func:`creation_key` of the spec it was created from."""


def autoscaled(group: GpuNodeGroupSpec) -> bool:
    """Whether cluster-autoscaler sizes the group (min < max): a desired size in its template
    would reset the autoscaler's work on every scaling update."""
    return group.min_nodes < group.max_nodes


AMI_TYPE = "AL2023_x86_64_NVIDIA"
"""The GPU groups' ``AmiType`` (create-only; CloudFormation spells it with a lower-case "x86")."""


def creation_key(group: GpuNodeGroupSpec, gpu_availability_zone: str, availability_zones: tuple[str, ...]) -> str:
    """What, changed, makes CloudFormation replace the group: the spec inputs of the schema's
    createOnlyProperties (a tag value: letters, digits, ./_-). InstanceTypes and CapacityType:
    ``instance_type``, ``capacity``; Subnets: the GPU AZ's private subnet, whose CIDR block
    (create-only on AWS::EC2::Subnet) follows its place among ``cluster.availability_zones``
    sorted by name (infra/stacks/network.py carves the subnets in that order, so the order the
    spec lists them in does not count); AmiType: :data:`AMI_TYPE`.
    NodeRole, ClusterName, RemoteAccess, NodegroupName and DiskSize no spec field drives (the
    disk is in the launch template: a new version, not a replacement)."""
    zones = ".".join(sorted(availability_zones))
    return f"{'+'.join(group.all_instance_types)}/{group.capacity}/{gpu_availability_zone}/{zones}/{AMI_TYPE}"


def identity_tags(group: GpuNodeGroupSpec, gpu_availability_zone: str, availability_zones: tuple[str, ...]) -> dict[str, str]:
    """The tags by which verify finds the group again."""
    return {GROUP_TAG: group.name, CREATION_TAG: creation_key(group, gpu_availability_zone, availability_zones)}


def existing(env: Environment, node_group_tags: Iterable[dict[str, str]]) -> frozenset[str]:
    """The names of ``env``'s GPU groups that a deploy updates in place, given the tags of every
    node group of the cluster (EKS DescribeNodegroup ``tags``)."""
    found = {(tags.get(GROUP_TAG), tags.get(CREATION_TAG)) for tags in node_group_tags}
    az, zones = env.cluster.gpu_availability_zone, env.cluster.availability_zones
    return frozenset(g.name for g in env.gpu_node_groups if (g.name, creation_key(g, az, zones)) in found)


def reset_warning(env: Environment) -> str | None:
    """The one line a synth prints when it cannot know which groups exist (no recent verify,
    deployed with the override): every autoscaled group keeps its desired size (safe to create)."""
    # An existing cluster's own groups (``existing``) are not in any template of this app.
    groups = [g.name for g in env.gpu_node_groups if autoscaled(g) and not g.existing]
    if not groups:
        return None
    return (f"warning: {env.source}: no recent `raytrain-eks verify` says which GPU node groups exist, so "
            f"{', '.join(groups)} keep(s) DesiredSize = min_nodes: a later min/max_nodes edit may reset the running "
            f"size to it (run `raytrain-eks verify --env {env.source}` before deploying)")
