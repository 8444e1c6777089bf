"""Build the CDK app from an environment spec: the one function app.py and the tests call.

``build_app(env)`` creates the network, storage and cluster stacks (and the pipeline stack when
``env.pipeline.enabled``) and registers cdk-nag's AwsSolutions checks as a synth-time
validation plugin. It reads nothing from files, context or the environment: app.py does that.

What the spec resolves to before any construct exists is here too, so that a spec this app
cannot build is refused first (:class:`InfraSpecError`): the Helm add-ons with their versions
and CRDs, and the kubectl/helm Lambda layer of the cluster's Kubernetes version. So is what the
app does to every stack once built: each Lambda function's log group (:func:`own_function_logs`).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aws_cdk as cdk
from aws_cdk import RemovalPolicy, Stack, Token, aws_lambda, aws_logs as logs
from constructs import Construct

from environment import Environment, SpecError
from environment.addons import installed_addons, present_addons_with_objects
from environment.contract import KUBERNETES_VERSIONS, stack_name
from infra.constructs.cluster_addons import ResolvedAddon
from infra.nag import add_nag_checks
from infra.stacks.attached import AttachedClusterStack
from infra.stacks.cluster import ClusterStack, retention_days
from infra.stacks.network import NetworkStack
from infra.stacks.storage import StorageStack
from environment.image_source import cache_prefix


class InfraSpecError(SpecError):
    """The spec is valid on its own but cannot be built by this CDK app (e.g. no kubectl layer
    is installed for its Kubernetes version); ``str(err)`` is the one line to print."""


# --- The kubectl/helm Lambda layer that matches the cluster's Kubernetes version ---------------
# The kubectl provider runs ``kubectl`` and ``helm`` against the cluster; its client should match
# the server's minor version. Each layer is a separate PyPI package
# (``aws-cdk.lambda-layer-kubectl-v3x``). The versions this app supports are listed ONCE, in
# environment/contract.py (the spec refuses any other); this maps each to its package.

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


def own_function_logs(stack: Stack, retention_days: int) -> None:
    """Give each function of ``stack`` that has no log group of its own a stack-owned one
    (Lambda's ``LoggingConfig.LogGroup``) kept ``retention_days`` and deleted with the stack.

    Every Lambda function a stack creates, its own or one a CDK construct adds (the kubectl
    provider's handler and its framework function, AwsCustomResource's singleton), so writes to
    a log group the stack owns, with a retention: left to Lambda, ``/aws/lambda/<name>`` is
    created on the first invocation with no retention and outlives ``cdk destroy``."""
    for construct in stack.node.find_all():
        if not isinstance(construct, aws_lambda.CfnFunction):
            continue
        config = construct.logging_config
        if config is not None and not Token.is_unresolved(config) and getattr(config, "log_group", None):
            continue  # already chosen by its owner
        group = logs.CfnLogGroup(construct.node.scope, f"{construct.node.id}LogGroup",
                                 retention_in_days=retention_days)
        group.apply_removal_policy(RemovalPolicy.DESTROY)
        construct.add_property_override("LoggingConfig.LogGroup", group.ref)


@dataclass(frozen=True, kw_only=True, slots=True)
class BuiltApp:
    """The app and its stacks."""

    app: cdk.App
    network: NetworkStack | None
    """None on an existing cluster (``cluster.existing``): its VPC is the cluster's."""
    storage: StorageStack
    cluster: ClusterStack | AttachedClusterStack
    pipeline: Any = None
    """``infra.stacks.pipeline.PipelineStack`` when ``env.pipeline.enabled``, else None."""


def availability_zone_context(env: Environment) -> dict[str, list[str]]:
    """The context entry CDK would otherwise look up with credentials: the spec's AZs ARE the
    answer, so an account-bound synth needs no network. Empty for an env-agnostic spec."""
    c = env.cluster
    if not c.account:
        return {}
    return {f"availability-zones:account={c.account}:region={c.region}": list(c.availability_zones)}


def cdk_environment(env: Environment) -> cdk.Environment:
    """Account (if the spec has one; else left to the deploying credentials) and region."""
    return cdk.Environment(account=env.cluster.account or None, region=env.cluster.region)


def new_app(env: Environment, **kwargs: Any) -> cdk.App:
    """An App with the spec-derived lookup context (what app.py and the tests both use)."""
    context = {
        # Explicit "strong" references (the current default) instead of an unset flag warning:
        # the cluster stack imports the VPC's exports, so the network stack cannot drop them.
        "@aws-cdk/core:defaultCrossStackReferences": "strong",
        **availability_zone_context(env),
        **kwargs.pop("context", {}),
    }
    return cdk.App(context=context, **kwargs)


def deployability_problem(env: Environment) -> str | None:
    """What the user must choose before this spec can be deployed (None: nothing). Checked
    before any construct (or the output directory) exists."""
    if not env.cluster.admin_principal_arns and not env.cluster.existing:
        return (f"{env.source}: cluster.admin_principal_arns: [] names nobody who may run kubectl: "
                "add your IAM role or user ARN (EKS's creator-admin is CloudFormation's role, not you)")
    if not env.storage.bucket_name and not env.cluster.account:
        return (f"{env.source}: storage.bucket_name: '' cannot be derived without cluster.account "
                "(S3 names are global): set cluster.account to your 12-digit account id, or storage.bucket_name")
    return None


def resolved_addons(env: Environment) -> list[ResolvedAddon]:
    """Every add-on of the table this spec installs (environment/addons.py ``installed_addons``),
    with the spec's version, values and pinned CRDs."""
    resolved = []
    for a in installed_addons(env):
        version = env.versions.chart(a.key)
        crd_file = a.crds(version) if a.crds is not None else None
        if crd_file is not None and not crd_file.is_file():
            raise InfraSpecError(f"{env.source}: versions.{a.key}: {version!r} has no pinned CRDs "
                                 f"(add {crd_file.name} from that release to {crd_file.parent})")
        resolved.append(ResolvedAddon(addon=a, version=version, values=a.values(env),
                                      objects=a.manifests(env), crd_file=crd_file))
    return resolved


def present_addon_objects(env: Environment) -> list[ResolvedAddon]:
    """The add-ons an existing cluster already runs whose objects this app still creates
    (environment/addons.py ``present_addons_with_objects``): objects only, no chart."""
    return [ResolvedAddon(addon=a, version=env.versions.chart(a.key), values={}, objects=a.manifests(env))
            for a in present_addons_with_objects(env)]


def refuse_deploy(stack: cdk.Stack, line: str) -> None:
    """A CloudFormation rule that always fails with ``line``: CloudFormation checks rules when
    it validates a template for a change set, so ``cdk deploy`` of ``stack`` stops there, before
    any change, with that one line (CloudFormation User Guide, "Rules" section syntax)."""
    cdk.CfnRule(stack, "VerifiedBeforeDeploy", assertions=[cdk.CfnRuleAssertion(
        assert_=cdk.Fn.condition_equals("unverified", "verified"), assert_description=line)])


def build_app(env: Environment, app: cdk.App | None = None, *, deploy_refusal: str | None = None,
              existing_gpu_groups: frozenset[str] = frozenset()) -> BuiltApp:
    """Create every stack of ``env`` in ``app`` (a new App with the AZ context if None).
    ``deploy_refusal``: why the cluster stack may not be deployed yet (infra/verify_gate.py);
    the stack then carries a rule that refuses the deploy with it (a synth still succeeds).
    ``existing_gpu_groups``: the GPU groups a deploy updates in place (infra/verify_gate.py;
    default none: every group is written as a creation, with its desired size).

    Raises :class:`InfraSpecError` (a SpecError) before creating anything when the
    spec cannot be built here (e.g. no kubectl layer for its Kubernetes version).
    """
    problem = deployability_problem(env)
    if problem:
        raise InfraSpecError(problem)
    layer = kubectl_layer_factory(env)  # refuse early: before any construct exists
    app = app if app is not None else new_app(env)
    name = env.cluster.name
    where = cdk_environment(env)
    # Stable tags only: a tag that follows the spec (e.g. its hash, which `lock` changes) would
    # touch every resource on each change, and a placement group is REPLACED on a tag change.
    tags = {"raytrain:cluster": name}
    c = env.cluster
    network = None if c.existing else NetworkStack(
        app, stack_name(name, "network"), availability_zones=c.availability_zones,
        gpu_availability_zone=c.gpu_availability_zone, ecr_endpoints=env.image.pull_through_cache,
        env=where, tags=tags, description=f"raytrain-eks {name}: VPC, NAT, S3 endpoint")
    storage = StorageStack(app, stack_name(name, "storage"), bucket_name=env.bucket_name, storage_uri=env.storage_uri,
                           noncurrent_version_days=env.storage.noncurrent_version_days,
                           existing_bucket=env.storage.existing_bucket, env=where, tags=tags,
                           description=f"raytrain-eks {name}: checkpoint bucket (retained)")
    common = dict(spec=c, gpu_groups=env.gpu_node_groups, ray=env.ray, addons=resolved_addons(env),
                  bucket_name=env.bucket_name, storage_prefix=env.storage.prefix,
                  read_only_prefixes=env.storage.read_only_prefixes, kubectl_layer=layer,
                  existing_gpu_groups=existing_gpu_groups, env=where, tags=tags)
    if c.existing:
        cluster = AttachedClusterStack(app, stack_name(name, "cluster"), **common,
                                       present_addons=present_addon_objects(env),
                                       description=f"raytrain-eks {name}: onto EKS cluster {c.existing}, "
                                                   "only what it lacks")
    else:
        cluster = ClusterStack(app, stack_name(name, "cluster"), system=env.system_node_group, network=network,
                               image_cache_prefix=cache_prefix(name) if env.image.pull_through_cache else None,
                               **common, description=f"raytrain-eks {name}: EKS cluster, GPU nodes, add-ons")
    # The pod policy names the bucket: deploy the bucket first.
    cluster.add_stack_dependency(storage)
    if deploy_refusal:
        refuse_deploy(cluster, deploy_refusal)
    pipeline = None
    if env.pipeline.enabled:
        from infra.stacks.pipeline import PipelineStack  # written separately; heavy, optional

        pipeline = PipelineStack(app, stack_name(name, "pipeline"), env_spec=env, cluster_stack=cluster,
                                 storage_stack=storage, env=where)
    days = retention_days(c.log_retention_days)
    for stack in (network, storage, cluster, pipeline):
        if stack is not None:
            own_function_logs(stack, days)
    add_nag_checks(app)
    return BuiltApp(app=app, network=network, storage=storage, cluster=cluster, pipeline=pipeline)
