"""cdk-nag rules of our own, for what AwsSolutions cannot see here: its EKS rules (EKS1 public
endpoint, EKS2 control-plane logs) match only ``aws_eks.CfnCluster`` and the v1 custom resource
(cdk-nag 3.0.2 lib/rules/eks/EKSClusterNoEndpointPublicAccess.js ``node instanceof
aws_eks.CfnCluster``), never the ``aws_eks_v2`` cluster, which is an ``AWS::EKS::Cluster`` of
another class. These read the resource type instead, so they see every cluster.

- ``Raytrain-EKS1``: the API endpoint is public to every address (no ``PublicAccessCidrs``, or
  one of them ``0.0.0.0/0``). A spec that chooses that is acknowledged where the cluster is
  built, naming the field, so the rule fails only on an endpoint the spec did not ask for.
- ``Raytrain-EKS2``: a control-plane log type is not exported (one finding per missing type,
  ``Raytrain-EKS2[LogExport::<type>]``).
"""
from __future__ import annotations

import jsii
from aws_cdk import CfnResource, Stack
from cdk_nag import IApplyRule, NagMessageLevel, NagPack, NagRuleCompliance

from environment.cluster import OPEN_TO_ALL

PACK = "Raytrain"
CONTROL_PLANE_LOGS = ("api", "audit", "authenticator", "controllerManager", "scheduler")
ENDPOINT_RULE = f"{PACK}-EKS1"
LOGS_RULE = f"{PACK}-EKS2"


def _resolved(node: CfnResource) -> dict:
    """The cluster's properties, resolved, with the template's (PascalCase) keys: the L1's own
    attributes, as cdk-nag's rules read them (``Stack.of(node).resolve(node.<property>)``)."""
    stack = Stack.of(node)
    vpc = stack.resolve(node.resources_vpc_config) or {}
    logging = stack.resolve(node.logging) or {}
    cluster_logging = logging.get("clusterLogging", {}) if isinstance(logging, dict) else {}
    return {
        "ResourcesVpcConfig": {"EndpointPublicAccess": vpc.get("endpointPublicAccess"),
                               "PublicAccessCidrs": vpc.get("publicAccessCidrs")},
        "Logging": {"ClusterLogging": {"EnabledTypes": [
            {"Type": t.get("type")} for t in cluster_logging.get("enabledTypes", []) or []]}},
    }


def endpoint_open_to_all(properties: dict) -> bool:
    vpc = properties.get("ResourcesVpcConfig", {})
    if vpc.get("EndpointPublicAccess") is False:
        return False
    cidrs = vpc.get("PublicAccessCidrs")
    return not cidrs or OPEN_TO_ALL in cidrs


def missing_logs(properties: dict) -> list[str]:
    types = [t.get("Type") for t in properties.get("Logging", {}).get("ClusterLogging", {}).get("EnabledTypes", [])]
    return [f"LogExport::{t}" for t in CONTROL_PLANE_LOGS if t not in types]


@jsii.implements(IApplyRule)
class _Rule:
    # Properties, not plain attributes: jsii reads an interface implemented in Python through
    # the class's own members.
    def __init__(self, node: CfnResource, suffix: str, info: str, explanation: str, check) -> None:
        self._node, self._suffix, self._info, self._explanation, self._check = node, suffix, info, explanation, check

    @property
    def node(self) -> CfnResource:
        return self._node

    @property
    def rule_suffix_override(self) -> str:
        return self._suffix

    @property
    def info(self) -> str:
        return self._info

    @property
    def explanation(self) -> str:
        return self._explanation

    @property
    def level(self) -> NagMessageLevel:
        return NagMessageLevel.ERROR

    def rule(self, node: CfnResource):
        return self._check(_resolved(node))


def _endpoint(properties: dict):
    return NagRuleCompliance.NON_COMPLIANT if endpoint_open_to_all(properties) else NagRuleCompliance.COMPLIANT


def _logs(properties: dict):
    return missing_logs(properties) or NagRuleCompliance.COMPLIANT


class RaytrainChecks(NagPack):
    """The pack: add it beside AwsSolutionsChecks (infra.nag.add_nag_checks)."""

    def __init__(self, scope=None) -> None:
        super().__init__(scope)
        self._pack_name = PACK

    @property
    def name(self) -> str:
        return PACK

    def _check_resource(self, node: CfnResource) -> None:
        if node.cfn_resource_type != "AWS::EKS::Cluster":
            return
        self._apply_rule(_Rule(
            node, "EKS1", "The EKS API endpoint is public to every address (0.0.0.0/0).",
            "Narrow cluster.public_access_cidrs to the office/VPN CIDRs, or use a private endpoint.", _endpoint))
        self._apply_rule(_Rule(
            node, "EKS2", "The EKS cluster does not export every control-plane log type.",
            "api, audit, authenticator, controllerManager and scheduler logs show who did what to the cluster.",
            _logs))
