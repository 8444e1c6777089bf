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


def stamp(env: Environment, account: str, now: datetime, existing_gpu_groups: frozenset[str] = frozenset(),
          cluster_stack: str | None = None) -> str:
    """The stamp's text for a verify of ``env`` that passed with credentials of ``account`` and
    found ``existing_gpu_groups`` deployed while the cluster stack was ``cluster_stack``
    (:func:`stack_state`; None: not read, so the groups are trusted by no deploy)."""
    return json.dumps({"spec_hash": env.spec_hash, "account": account, "passed_at": now.isoformat(),
                       "existing_gpu_groups": sorted(existing_gpu_groups), "cluster_stack": cluster_stack})


ABSENT = "absent"
""":func:`stack_state` of a cluster stack that does not exist (never created, or destroyed)."""


def stack_state(cloudformation, name: str) -> str:
    """Which cluster stack, as of which change: ``<StackId>@<LastUpdatedTime or CreationTime>``,
    or :data:`ABSENT`. CloudFormation gives a re-created stack a new StackId and stamps every
    update that changed anything with a new LastUpdatedTime (DescribeStacks; an update with no
    changes is refused as "No updates are to be performed" and stamps nothing), so two equal
    states mean no deploy or destroy happened in between: the node groups read then are the
    node groups now."""
    from botocore.exceptions import ClientError  # the caller has boto3: it built the client

    try:
        stacks = cloudformation.describe_stacks(StackName=name)["Stacks"]
    except ClientError as err:
        if "does not exist" in str(err):
            return ABSENT
        raise
    live = [s for s in stacks if s["StackStatus"] != "DELETE_COMPLETE"]
    if not live:
        return ABSENT
    changed = live[0].get("LastUpdatedTime") or live[0]["CreationTime"]
    return f"{live[0]['StackId']}@{changed.isoformat() if hasattr(changed, 'isoformat') else changed}"


def stale(env: Environment, recorded: str, current_stack: str | None) -> str | None:
    """Why the record's GPU groups no longer say what exists (None: they do). The record is a
    reading of the cluster stack at one state; a deploy that created or replaced a group, or a
    ``cdk destroy``, changed that state since, and trusting the old reading would send
    DesiredSize to a group that exists (resetting its running nodes) or omit it on one that must
    be created (EKS refuses the creation). ``current_stack``: :func:`stack_state` now (None:
    it could not be read)."""
    fix = f"run `raytrain-eks verify --env {env.source}` again and deploy"
    was = json.loads(recorded).get("cluster_stack")
    if current_stack is None:
        return f"{env.source}: the cluster stack's state could not be read, so which GPU node groups exist is unknown: {fix}"
    if was is None:
        return f"{env.source}: the verify record does not say which cluster stack it read the GPU node groups of: {fix}"
    if was != current_stack:
        return (f"{env.source}: the cluster stack changed after `raytrain-eks verify` read its GPU node groups "
                f"(then {was}, now {current_stack}): {fix}")
    return None


def decide(env: Environment, recorded: str | None, now: datetime, deploying_account: str, skip: bool,
           current_stack=lambda: None) -> tuple[str | None, frozenset[str], str | None]:
    """What a ``cdk deploy`` writes (app.py, the pipeline's Deploy and the update oracle all ask
    this): why the cluster stack may not be deployed (None: it may), the GPU groups that exist
    (only these get no DesiredSize) and the warning to print. ``current_stack``: reads
    :func:`stack_state` at the deploy (called only when a record would be trusted).

    The override (``skip``) skips the verify's checks, not the reading of the node groups: a
    record whose stack changed since refuses the deploy either way. Without any record the
    override writes every autoscaled group as a creation and warns (:func:`reset_warning`)."""
    gate = refusal(env, recorded, now, deploying_account)
    found: frozenset[str] | None = None
    if recorded is not None and (gate is None or skip):
        outdated = stale(env, recorded, current_stack())
        if outdated is not None:
            return outdated, frozenset(), None
        found = recorded_groups(recorded)
    if skip:
        gate = None
    warning = reset_warning(env) if gate is None and found is None else None
    return gate, (found or frozenset()), warning


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


SUBNET_TAG = "raytrain:gpu-subnet"
"""On an existing cluster (``cluster.existing``) the node group's tag holding :func:`gpu_subnet_id`.
There the group's Subnets are the spec's literal ``private_subnet_ids`` (create-only on
``AWS::EKS::Nodegroup``: another id in the GPU AZ's place replaces the group), which
:func:`creation_key`'s AZ list does not say. A group created before this tag has none and
counts by :func:`creation_key` alone."""


def gpu_subnet_id(gpu_availability_zone: str, availability_zones: tuple[str, ...],
                  private_subnet_ids: tuple[str, ...]) -> str:
    """The GPU AZ's subnet of an existing cluster's spec ('' when the app makes the VPC): the
    id at the AZ's index, as aws-cdk-lib's ``Vpc.fromVpcAttributes`` pairs them (infra/stacks/attached.py)."""
    if not private_subnet_ids or gpu_availability_zone not in availability_zones:
        return ""
    return private_subnet_ids[list(availability_zones).index(gpu_availability_zone)]


def identity_tags(group: GpuNodeGroupSpec, gpu_availability_zone: str, availability_zones: tuple[str, ...],
                  private_subnet_ids: tuple[str, ...] = ()) -> dict[str, str]:
    """The tags by which verify finds the group again."""
    subnet = gpu_subnet_id(gpu_availability_zone, availability_zones, private_subnet_ids)
    return {GROUP_TAG: group.name, CREATION_TAG: creation_key(group, gpu_availability_zone, availability_zones),
            **({SUBNET_TAG: subnet} if subnet else {})}


def existing(env: Environment, node_group_tags: Iterable[dict[str, str]]) -> frozenset[str]:
    """The names of ``env``'s GPU groups that a deploy updates in place, given the tags of every
    node group of the cluster (EKS DescribeNodegroup ``tags``)."""
    az, zones = env.cluster.gpu_availability_zone, env.cluster.availability_zones
    subnet = gpu_subnet_id(az, zones, tuple(env.cluster.private_subnet_ids))
    found = {(tags.get(GROUP_TAG), tags.get(CREATION_TAG)) for tags in node_group_tags
             if tags.get(SUBNET_TAG, subnet) == subnet}
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
