"""The update oracle: what a later ``cdk deploy`` (or ``cdk destroy``) does to what is running.

Given the templates of one stack before and after an edit of environment.toml, it lists each
resource CloudFormation would add, update in place, replace or delete, and what of that touches
running nodes or removes a protection. Two sources decide it:

- CloudFormation's own resource schemas as cfn-lint 1.58 ships them
  (``cfnlint/data/schemas/resources/*.json``, from the CloudFormation registry's provider
  schemas): a changed ``createOnlyProperties`` entry means replacement. A replaced resource gets
  a new physical id, so every ``Ref``/``Fn::GetAtt`` to it changes too (followed to a fixpoint).
- What the schemas do not encode (each rule cites its source):

  * ``AWS::EKS::Nodegroup`` ``ScalingConfig``: CloudFormation sends the whole scaling config on
    an update, DesiredSize included, and "Whenever this parameter changes, the number of worker
    nodes in the node group is updated to the specified size [...] the necessary number of
    worker nodes are terminated"; "When using CloudFormation, no action occurs if you remove
    this parameter from your CFN template" (EKS API Reference, NodegroupScalingConfig,
    desiredSize). Seen in the field: eksctl-io/eksctl issue 3532 (a max-size edit reset the
    cluster-autoscaled desired size to the template's value), aws/containers-roadmap issue 1259.
    So a ScalingConfig update of an autoscaled group (min < max) that carries DesiredSize resets
    the group to it; one without DesiredSize leaves the running size alone. A node group is
    CREATED (added, or a replacement) with all of MinSize, MaxSize and DesiredSize or none:
    "When creating a node group, you must specify all or none of the properties" (same page, and
    the CloudFormation User Guide's AWS::EKS::Nodegroup ScalingConfig page).
  * ``AWS::EC2::LaunchTemplate``: an update of LaunchTemplateData creates a new version
    (``LatestVersionNumber`` changes); a node group that follows it gets a new
    ``LaunchTemplate.Version`` and EKS replaces every node, one at a time (EKS User Guide,
    "Update a managed node group": a launch template version update is a rolling node update).
  * A replaced ``AWS::EKS::Nodegroup`` terminates all of the old group's nodes once the new
    group exists (CloudFormation deletes the old physical resource after the replacement).
  * Deleting a resource without ``DeletionPolicy: Retain`` deletes it; an
    ``AWS::S3::BucketPolicy`` deleted while its bucket is retained leaves that bucket without
    its TLS-only deny and log-delivery grant (CloudFormation User Guide, DeletionPolicy
    attribute: the default for every resource but a few stateful types is Delete).
  * An ``AWS::S3::BucketPolicy`` is identified by its bucket (its schema's primaryIdentifier is
    ``/properties/Bucket``): creating one for a bucket that already has a policy (one the old
    template still holds, or one a ``cdk destroy`` retained) fails with "Bucket Policy Already
    Exists" (the aws-cloudformation-resource-providers-s3 BucketPolicy handler's create returns
    HandlerErrorCode AlreadyExists; seen in the field: getlift/lift issue 356). CloudFormation
    creates new resources before it deletes the old ones, so even a policy the update removes is
    still there.
  * A replaced ``AWS::EC2::Subnet`` is created while the one it replaces still exists (the same
    create-then-delete order: CloudFormation User Guide, "Update behaviors of stack resources",
    Replacement); EC2 refuses a subnet whose CIDR block another subnet of the VPC holds
    (EC2 API Reference, error codes: ``InvalidSubnet.Conflict``), so a replacement with the
    same CIDR fails the update.
  * An output's ``Export`` that another stack imports cannot change: "You can't modify or
    remove an output value that is referenced by another stack" (CloudFormation User Guide,
    "Get exported outputs from a deployed CloudFormation stack"). CDK's strong cross-stack
    references export the VPC and subnet ids to the cluster stack, and deploy the exporter
    first, so a replaced subnet refuses the network stack's update.
"""
from __future__ import annotations

import copy
import json
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import cfnlint

SCHEMAS = Path(cfnlint.__file__).parent / "data" / "schemas"
STACKS = ("network", "storage", "cluster")

# Attributes that change on an in-place update (not only on replacement).
VERSIONED_ATTRIBUTES = {("AWS::EC2::LaunchTemplate", "LatestVersionNumber"),
                        ("AWS::EC2::LaunchTemplate", "DefaultVersionNumber")}
# Resources whose running things a change touches: node groups (their EC2 instances).
NODE_GROUP = "AWS::EKS::Nodegroup"


@cache
def create_only(type_name: str) -> tuple[tuple[str, ...], ...]:
    """The create-only property paths of a type (``()`` for custom resources: no schema)."""
    index = json.loads((SCHEMAS / "providers" / "us-east-1.json").read_text())
    if type_name not in index:
        return ()
    schema = json.loads((SCHEMAS / "resources" / f"{index[type_name]}.json").read_text())
    return tuple(tuple(p.removeprefix("/properties/").split("/"))
                 for p in schema.get("createOnlyProperties", []))


@dataclass(frozen=True)
class Change:
    """One resource's fate in one stack: ``action`` is add, update, replace or delete;
    ``effect`` says what running thing or protection it touches ('' for none)."""

    stack: str
    logical_id: str
    type: str
    action: str
    effect: str = ""

    def row(self) -> str:
        return f"{self.stack:8} {self.type:34} {self.logical_id:44} {self.action:8} {self.effect}"


def _marked(value, replaced: set[str], versioned: set[str]):
    """``value`` with every reference to a replaced resource (or to a version attribute of an
    updated launch template) marked, so that it compares unequal to the old template's."""
    if isinstance(value, dict):
        if set(value) == {"Ref"} and value["Ref"] in replaced:
            return {"Ref": value["Ref"], "new-physical-id": True}
        if set(value) == {"Fn::GetAtt"}:
            target, attribute = value["Fn::GetAtt"][0], value["Fn::GetAtt"][1]
            if target in replaced or (target, attribute) in versioned:
                return {"Fn::GetAtt": value["Fn::GetAtt"], "new-value": True}
        return {k: _marked(v, replaced, versioned) for k, v in value.items()}
    if isinstance(value, list):
        return [_marked(v, replaced, versioned) for v in value]
    return value


def _at(props: dict, path: tuple[str, ...]):
    for key in path:
        if not isinstance(props, dict) or key not in props:
            return None
        props = props[key]
    return props


def _changed(old: dict, new: dict) -> set[str]:
    """Top-level properties that differ."""
    return {k for k in set(old) | set(new) if old.get(k) != new.get(k)}


def _node_group_effect(old: dict, new: dict, changed: set[str]) -> str:
    effects = []
    if "ScalingConfig" in changed:
        scaling = new.get("ScalingConfig", {})
        autoscaled = scaling.get("MinSize", 0) < scaling.get("MaxSize", 0)
        if autoscaled and "DesiredSize" in scaling:
            effects.append(f"DESIRED SIZE RESET to {scaling['DesiredSize']}: cluster-autoscaler's nodes above it are terminated")
        elif autoscaled and scaling.get("MinSize", 0) > old.get("ScalingConfig", {}).get("MinSize", 0):
            # EKS refuses a minSize above the group's current desired size ("Minimum capacity N
            # can't be greater than desired size"; aws/containers-roadmap issue 1637)
            effects.append("MAY BE REFUSED: EKS rejects a min size above the running size (scale up first)")
        elif autoscaled and scaling.get("MaxSize", 0) < old.get("ScalingConfig", {}).get("MaxSize", 0):
            # and a maxSize below it: the running desired size stays, and EKS refuses the update
            # ("desiredSize can't be greater than maxSize": EKS API Reference,
            # UpdateNodegroupConfig, InvalidParameterException)
            effects.append("MAY BE REFUSED: EKS rejects a max size below the running size (scale down first)")
    if _at(old, ("LaunchTemplate", "Version")) != _at(new, ("LaunchTemplate", "Version")):
        effects.append("NODES ROLLED: new launch template version, every node replaced")
    return "; ".join(effects)


SCALING_PROPERTIES = {"MinSize", "MaxSize", "DesiredSize"}
BUCKET_POLICY = "AWS::S3::BucketPolicy"


def _bucket_name(policy: dict, resources: dict[str, dict]):
    """The bucket a policy is on: a literal name, or the ``BucketName`` of the bucket it refers
    to in ``resources`` (else the reference itself)."""
    bucket = _at(policy, ("Properties", "Bucket"))
    if isinstance(bucket, dict) and bucket.get("Ref") in resources:
        return _at(resources[bucket["Ref"]], ("Properties", "BucketName")) or json.dumps(bucket)
    return bucket if isinstance(bucket, str) else json.dumps(bucket)


def policy_buckets(resources: dict[str, dict], named_only: bool = False) -> set[str]:
    """The buckets that hold a policy of ``resources`` (one bucket, at most one policy);
    ``named_only``: only those with a fixed name (a destroyed stack's generated bucket names
    are never a new stack's)."""
    names = {_bucket_name(r, resources) for r in resources.values() if r["Type"] == BUCKET_POLICY}
    return {n for n in names if not (named_only and n.startswith("{"))}


def _creation_effect(kind: str, props: dict, resources: dict[str, dict] | None = None,
                     held: set[str] = frozenset()) -> str:
    """What a creation meets: EKS refuses a node group's partial scaling config; S3 refuses a
    second policy on a bucket (``held``: the buckets with a policy in the account now)."""
    given = SCALING_PROPERTIES & set(props.get("ScalingConfig", {}))
    if kind == NODE_GROUP and given and given != SCALING_PROPERTIES:
        return f"CREATE REFUSED: a new node group needs all of MinSize, MaxSize, DesiredSize or none (has {', '.join(sorted(given))})"
    if kind == BUCKET_POLICY and _bucket_name({"Properties": props}, resources or {}) in held:
        return "CREATE REFUSED: Bucket Policy Already Exists (the bucket keeps its retained policy)"
    return ""


def diff_stack(stack: str, before: dict, after: dict, retained: dict[str, dict] | None = None) -> list[Change]:
    """What CloudFormation does to ``stack`` when ``before`` is updated to ``after``;
    ``retained``: resources an earlier ``cdk destroy`` left in the account (see :func:`kept`)."""
    old_resources, new_resources = before.get("Resources", {}), after.get("Resources", {})
    held = policy_buckets(old_resources) | policy_buckets(retained or {}, named_only=True)
    common = sorted(set(old_resources) & set(new_resources))
    replaced: set[str] = set()
    updated: set[str] = set()
    while True:  # a replacement changes every reference to it: follow to a fixpoint
        versioned = {(lid, attr) for lid in updated for (t, attr) in VERSIONED_ATTRIBUTES
                     if new_resources[lid]["Type"] == t}
        grew = False
        for lid in common:
            old, new = old_resources[lid], new_resources[lid]
            if old["Type"] != new["Type"]:
                grew |= lid not in replaced
                replaced.add(lid)
                continue
            new_props = _marked(new.get("Properties", {}), replaced, versioned)
            old_props = old.get("Properties", {})
            if any(_at(old_props, p) != _at(new_props, p) for p in create_only(new["Type"])):
                grew |= lid not in replaced
                replaced.add(lid)
            elif _changed(old_props, new_props) and lid not in updated:
                updated.add(lid)
                grew = True
        if not grew:
            break
    changes = []
    for lid in common:
        old, new = old_resources[lid], new_resources[lid]
        kind = new["Type"]
        if lid in replaced:
            effect = "NODES TERMINATED: the old group is deleted after its replacement" if kind == NODE_GROUP else ""
            refused = _creation_effect(kind, new.get("Properties", {})) or _subnet_conflict(new, old_resources)
            changes.append(Change(stack, lid, kind, "replace", "; ".join(e for e in (refused, effect) if e)))
        elif lid in updated:
            versioned = {(u, attr) for u in updated for (t, attr) in VERSIONED_ATTRIBUTES
                         if new_resources[u]["Type"] == t}
            new_props = _marked(new.get("Properties", {}), replaced, versioned)
            old_props = old.get("Properties", {})
            effect = _node_group_effect(old_props, new_props, _changed(old_props, new_props)) if kind == NODE_GROUP else ""
            changes.append(Change(stack, lid, kind, "update", effect))
    for lid in sorted(set(new_resources) - set(old_resources)):
        kind = new_resources[lid]["Type"]
        changes.append(Change(stack, lid, kind, "add", _creation_effect(
            kind, new_resources[lid].get("Properties", {}), new_resources, held)))
    changes += deleted(stack, {lid: old_resources[lid] for lid in set(old_resources) - set(new_resources)},
                       old_resources)
    return changes + _changed_exports(stack, before, after, replaced)


def _subnet_conflict(new: dict, old_resources: dict[str, dict]) -> str:
    """A replacement subnet whose CIDR a subnet of the old template holds (it still exists)."""
    cidr = _at(new, ("Properties", "CidrBlock"))
    if new["Type"] != "AWS::EC2::Subnet" or cidr is None:
        return ""
    if any(r["Type"] == "AWS::EC2::Subnet" and _at(r, ("Properties", "CidrBlock")) == cidr for r in old_resources.values()):
        return f"UPDATE REFUSED: CIDR {cidr} is still held by the subnet it replaces (InvalidSubnet.Conflict)"
    return ""


def _changed_exports(stack: str, before: dict, after: dict, replaced: set[str]) -> list[Change]:
    """Exported outputs whose value changes (a literal, or a reference to a replaced resource);
    :func:`diff` marks those another stack imports as refused."""
    out = []
    for key, output in before.get("Outputs", {}).items():
        name = _at(output, ("Export", "Name"))
        new = after.get("Outputs", {}).get(key)
        if name and (new is None or _marked(new.get("Value"), replaced, set()) != output.get("Value")):
            out.append(Change(stack, key, "Export", "update" if new else "delete", f"EXPORT CHANGED: {name}"))
    return out


def _imports(value) -> set[str]:
    if isinstance(value, dict):
        found = {value["Fn::ImportValue"]} if isinstance(value.get("Fn::ImportValue"), str) else set()
        return found.union(*(_imports(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_imports(v) for v in value))
    return set()


def deleted(stack: str, gone: dict[str, dict], everything: dict[str, dict]) -> list[Change]:
    """What deleting ``gone`` (logical id -> resource of ``everything``) does: a Retain resource
    is left in the account; a bucket policy deleted while its bucket stays strips the bucket."""
    changes = []
    for lid in sorted(gone):
        resource = gone[lid]
        if resource.get("DeletionPolicy") == "Retain":
            changes.append(Change(stack, lid, resource["Type"], "retain"))
            continue
        effect = ""
        if resource["Type"] == "AWS::S3::BucketPolicy":
            bucket = _at(resource, ("Properties", "Bucket"))
            target = everything.get(bucket.get("Ref")) if isinstance(bucket, dict) else None
            if target is None or target.get("DeletionPolicy") == "Retain" or bucket.get("Ref") not in gone:
                effect = "PROTECTION REMOVED: the kept bucket loses its policy (TLS-only deny, log delivery)"
        if resource["Type"] == NODE_GROUP:
            effect = "NODES TERMINATED"
        changes.append(Change(stack, lid, resource["Type"], "delete", effect))
    return changes


def destroy(templates: dict[str, dict]) -> list[Change]:
    """What ``cdk destroy --all`` does to each stack's resources."""
    out = []
    for stack, template in templates.items():
        resources = template.get("Resources", {})
        out += deleted(stack, resources, resources)
    return out


def kept(templates_: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """Per stack, the resources ``cdk destroy`` of ``templates_`` leaves in the account."""
    return {stack: {lid: r for lid, r in t.get("Resources", {}).items() if r.get("DeletionPolicy") == "Retain"}
            for stack, t in templates_.items()}


def diff(before: dict[str, dict], after: dict[str, dict]) -> list[Change]:
    """Every stack's changes, ``before``/``after`` mapping stack part -> template; a changed
    export that another stack imports refuses its stack's update."""
    importers = {name: other for other, template in before.items() for name in _imports(template)}
    changes = [c for stack in before for c in diff_stack(stack, before[stack], after.get(stack, {}))]
    for i, c in enumerate(changes):
        name = c.effect.removeprefix("EXPORT CHANGED: ")
        if c.type == "Export" and importers.get(name, c.stack) != c.stack:
            changes[i] = Change(c.stack, c.logical_id, c.type, c.action,
                                f"UPDATE REFUSED: export {name} is imported by the {importers[name]} stack")
    return changes


def refused(changes: list[Change]) -> list[Change]:
    """The changes CloudFormation (or the service under it) refuses: the update rolls back."""
    return [c for c in changes if "REFUSED" in c.effect.split(":")[0]]


def templates(raw: dict, source: str = "environment.toml", existing_gpu_groups: frozenset[str] = frozenset()) -> dict[str, dict]:
    """The synthesized templates (network, storage, cluster) of a raw spec, in-process, for a
    deploy where ``existing_gpu_groups`` exist (default: none, a first deploy)."""
    from aws_cdk.assertions import Template

    from environment import environment_from_dict
    from infra.build import build_app, new_app

    env = environment_from_dict(raw, source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_app(env, new_app(env), existing_gpu_groups=existing_gpu_groups)
        # an existing cluster (cluster.existing) has no network stack: nothing of it is deployed
        return {part: Template.from_stack(getattr(built, part)).to_json() if getattr(built, part) is not None else {}
                for part in STACKS}


def _set(raw: dict, path: str, value) -> dict:
    out = copy.deepcopy(raw)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    node[last] = value
    return out


EDITS: dict[str, dict[str, object]] = {
    "gpu max_nodes 2 -> 3": {"gpu_node_groups.0.max_nodes": 3},
    "gpu max_nodes 2 -> 1": {"gpu_node_groups.0.max_nodes": 1},
    "gpu min_nodes 0 -> 1": {"gpu_node_groups.0.min_nodes": 1, "gpu_node_groups.0.desired_nodes": 1},
    "system nodes 1 -> 2": {"system_node_group.nodes": 2},
    "gpu instance_type -> g6.48xlarge": {"gpu_node_groups.0.instance_type": "g6.48xlarge"},
    "gpu root_volume_gib 200 -> 300": {"gpu_node_groups.0.root_volume_gib": 300},
    "gpu capacity on-demand -> spot": {"gpu_node_groups.0.capacity": "spot"},
    "gpu capacity on-demand -> spot with g5.12xlarge too": {"gpu_node_groups.0.capacity": "spot",
                                                           "gpu_node_groups.0.instance_types": ["g5.12xlarge"]},
    "cluster_autoscaler chart 9.59.0 -> 9.58.0": {"versions.cluster_autoscaler": "9.58.0"},
    "storage noncurrent_version_days 30 -> 7": {"storage.noncurrent_version_days": 7},
    "storage existing_bucket -> true (redeploy)": {"storage.existing_bucket": True},
    "observability enabled -> false": {"observability.enabled": False},
    "cluster log_retention_days 30 -> 90": {"cluster.log_retention_days": 90},
    "cluster endpoint_access -> private": {"cluster.endpoint_access": "private", "cluster.public_access_cidrs": []},
    "cluster gpu_availability_zone -> us-east-1b": {"cluster.gpu_availability_zone": "us-east-1b"},
    "cluster availability_zones -> [us-east-1b, us-east-1a]": {"cluster.availability_zones": ["us-east-1b", "us-east-1a"]},
}
"""The edits a user makes to environment.toml, as {dotted field: new value}. Kubernetes version:
the app supports one minor (environment/contract.py KUBERNETES_VERSIONS), so there is no edit;
pipeline settings live in the pipeline stack (its own tests)."""


def deployed_groups(raw: dict, deployed: dict[str, dict]) -> frozenset[str]:
    """What `raytrain-eks verify` records before deploying spec ``raw`` over the ``deployed``
    templates: the GPU groups of ``raw`` whose running node group carries their tags (EKS
    DescribeNodegroup returns the tags CloudFormation set from the template's Tags)."""
    from environment import environment_from_dict
    from infra.verify_gate import existing

    tags = [r.get("Properties", {}).get("Tags") or {} for r in deployed["cluster"].get("Resources", {}).values()
            if r["Type"] == NODE_GROUP]
    return existing(environment_from_dict(raw, "environment.toml"), tags)


def redeploy(raw: dict, deployed: dict[str, dict]) -> dict[str, dict]:
    """The templates a later `cdk deploy` of ``raw`` writes after a verify over ``deployed``."""
    return templates(raw, existing_gpu_groups=deployed_groups(raw, deployed))


def edited(raw: dict, edit: str) -> dict:
    for path, value in EDITS[edit].items():
        raw = _set(raw, path, value)
    return raw


def edit_results(raw: dict, baseline: dict[str, dict]) -> dict[str, list[Change]]:
    """Each edit of ``raw`` deployed over ``baseline`` (the first deploy), after a verify."""
    return {edit: diff(baseline, redeploy(edited(raw, edit), baseline)) for edit in EDITS}


def edit_over(raw: dict, changes: dict[str, object]) -> list[Change]:
    """``changes`` ({dotted field: value}) deployed over a running cluster of ``raw`` (its first
    deploy, then a verified redeploy): for edits that need another base spec than EDITS' (e.g.
    one with an account)."""
    deployed = redeploy(raw, templates(raw))
    for path, value in changes.items():
        raw = _set(raw, path, value)
    return diff(deployed, redeploy(raw, deployed))


CACHE_EDIT = ("image pull_through_cache -> true", {"image.pull_through_cache": True})
"""Turning the image cache on (the base spec needs cluster.account: tests/infra_variants.py
capacity_raw with the cache off)."""


def table(results: dict[str, list[Change]]) -> str:
    """The report: per edit, each changed resource and its effect."""
    lines = []
    for edit, changes in results.items():
        lines.append(f"## {edit}")
        lines += ["  " + c.row() for c in changes] or ["  (no change)"]
    return "\n".join(lines)


def touches_running(changes: list[Change]) -> list[Change]:
    """The changes that terminate or replace running nodes."""
    return [c for c in changes if c.effect.startswith(("DESIRED SIZE RESET", "NODES"))]


# --- Deploys with a verify record: what app.py writes from it (infra/verify_gate.py decide) -------

RECORD_ACCOUNT = "123456789012"


def stack_state(deployed: dict[str, dict]) -> str:
    """The model of infra/verify_gate.py stack_state over the deployed templates: ABSENT without a
    cluster stack (never deployed, or destroyed), else a digest of its template (CloudFormation
    stamps a new LastUpdatedTime on every update that changes the template, none on one that
    does not: "No updates are to be performed")."""
    import hashlib

    from infra.verify_gate import ABSENT

    cluster = deployed.get("cluster") or {}
    if not cluster.get("Resources"):
        return ABSENT
    return "stack@" + hashlib.sha256(json.dumps(cluster, sort_keys=True).encode()).hexdigest()[:12]


def verified(raw: dict, deployed: dict[str, dict]) -> str:
    """The record a passing `raytrain-eks verify` of ``raw`` writes over ``deployed`` (its text)."""
    from environment import environment_from_dict
    from infra import verify_gate

    env = environment_from_dict(raw, "environment.toml")
    groups = deployed_groups(raw, deployed) if deployed.get("cluster") else frozenset()
    return verify_gate.stamp(env, RECORD_ACCOUNT, verify_gate.now(), groups, stack_state(deployed))


def deploy_with(raw: dict, record: str | None, deployed: dict[str, dict], skip: bool = False) -> dict[str, dict] | str:
    """`cdk deploy` of ``raw`` over ``deployed`` with the verify record ``record``, as app.py
    decides it (infra/verify_gate.py decide, the stack's state read at the deploy): the new
    templates, or the refusal line (CloudFormation's rule fails: nothing changes)."""
    from environment import environment_from_dict
    from infra import verify_gate

    env = environment_from_dict(raw, "environment.toml")
    refusal, found, _ = verify_gate.decide(env, record, verify_gate.now(), RECORD_ACCOUNT, skip,
                                           lambda: stack_state(deployed))
    return refusal if refusal is not None else templates(raw, existing_gpu_groups=found)


def gone(deployed: dict[str, dict]) -> dict[str, dict]:
    """What is left after ``cdk destroy`` of the cluster stack (the network and storage stay)."""
    return {**deployed, "cluster": {}}
