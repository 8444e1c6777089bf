"""cdk-nag: the checks every synth runs, and the acknowledged findings.

Acknowledgements: one helper, and the findings on resources that CDK's own EKS constructs create
(control-plane role, node roles, kubectl provider). Findings on our own resources are
acknowledged next to the resource (see infra/constructs/). Every acknowledgement carries a real
reason; tests/infra counts them.

Rules of our own (:class:`RaytrainChecks`), for what AwsSolutions cannot see here: its EKS rules
(EKS1 public endpoint, EKS2 control-plane logs) match only ``aws_eks.CfnCluster`` and the v1
custom resource (cdk-nag 3.0.2 lib/rules/eks/EKSClusterNoEndpointPublicAccess.js ``node
instanceof aws_eks.CfnCluster``), never the ``aws_eks_v2`` cluster, which is an
``AWS::EKS::Cluster`` of another class. These read the resource type instead, so they see every
cluster.

- ``Raytrain-EKS1``: the API endpoint is public to every address (no ``PublicAccessCidrs``, or
  one of them ``0.0.0.0/0``). A spec that chooses that is acknowledged where the cluster is
  built, naming the field, so the rule fails only on an endpoint the spec did not ask for.
- ``Raytrain-EKS2``: a control-plane log type is not exported (one finding per missing type,
  ``Raytrain-EKS2[LogExport::<type>]``).
"""
from __future__ import annotations

import aws_cdk as cdk
import jsii
from aws_cdk import CfnResource, Stack, aws_eks_v2 as eks
from cdk_nag import AwsSolutionsChecks, IApplyRule, NagMessageLevel, NagPack, NagRuleCompliance
from constructs import IConstruct

from environment.cluster import OPEN_TO_ALL

MANAGED = "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{}]"

# The AWS managed policies EKS documents as required for managed node groups' node role (the
# CNI policy is not among them here: the VPC CNI has a Pod Identity role of its own).
NODE_ROLE_POLICIES = {
    "AmazonEKSWorkerNodePolicy": "kubelet registration and node describe calls",
    "AmazonEC2ContainerRegistryReadOnly": "pulls the EKS add-on images (VPC CNI, kube-proxy, "
                                          "pod-identity agent) from Amazon ECR",
}
IN_VPC = ("attaches to the cluster's private subnets whenever the private endpoint is on "
          "(endpoint_access private or public_and_private)")
KUBECTL_HANDLER_POLICIES = {
    "service-role/AWSLambdaBasicExecutionRole": "writes its own CloudWatch logs",
    "service-role/AWSLambdaVPCAccessExecutionRole": IN_VPC,
    "AmazonEC2ContainerRegistryReadOnly": "pulls Helm charts stored as OCI artifacts in ECR",
}
PROVIDER_FRAMEWORK_POLICIES = {
    "service-role/AWSLambdaBasicExecutionRole": "writes its own CloudWatch logs",
    "service-role/AWSLambdaVPCAccessExecutionRole": IN_VPC,
}
CDK_OWNED = "Created and scoped by aws-cdk-lib's aws_eks_v2 kubectl provider, not by this project: "


def add_nag_checks(app: cdk.App) -> None:
    """Run cdk-nag's AwsSolutions pack and our own Raytrain pack as synth-time validation
    plugins: any unacknowledged finding fails ``app.synth()`` (and ``cdk synth``) with a report."""
    # AwsSolutions' EKS rules do not see an aws_eks_v2 cluster; ours do (RaytrainChecks, below).
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app), RaytrainChecks(app))


def acknowledge(scope: IConstruct, rule_id: str, reason: str) -> None:
    """Acknowledge one cdk-nag finding (``AwsSolutions-XX`` or ``AwsSolutions-XX[finding]``) on
    ``scope`` and everything below it."""
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=rule_id, reason=reason))


def acknowledge_node_role(role: IConstruct) -> None:
    """The managed policies of the managed node groups' node role (required by EKS)."""
    for policy, why in NODE_ROLE_POLICIES.items():
        acknowledge(role, MANAGED.format(policy),
                    f"EKS requires {policy} on a managed node group's node role: {why}.")


def acknowledge_cluster_findings(cluster: eks.Cluster) -> None:
    """The control-plane role and the kubectl provider of an aws_eks_v2 cluster."""
    acknowledge(cluster, MANAGED.format("AmazonEKSClusterPolicy"),
                "EKS requires AmazonEKSClusterPolicy on the cluster (control-plane) role.")
    acknowledge_kubectl_provider(cluster.node.find_child("KubectlProvider"))


def acknowledge_kubectl_provider(provider: IConstruct) -> None:
    """The findings on aws_eks_v2's ``KubectlProvider`` (the cluster's own, or one made for an
    imported cluster: infra/stacks/attached.py)."""
    handler = provider.node.find_child("Handler")
    for policy, why in KUBECTL_HANDLER_POLICIES.items():
        acknowledge(handler, MANAGED.format(policy), CDK_OWNED + f"its kubectl/helm handler {why}.")
    # The public-ECR read policy is attached only under a CloudFormation condition, so the
    # finding's id carries the condition's logical id.
    condition = handler.node.find_child("HasEcrPublic")
    stack = cdk.Stack.of(provider)
    public_ecr = (
        '{"Fn::If":["' + stack.get_logical_id(condition) + '",{"Fn::Join":["",["arn:",'
        '{"Ref":"AWS::Partition"},":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly"]]},'
        '{"Ref":"AWS::NoValue"}]}')
    acknowledge(handler, f"AwsSolutions-IAM4[Policy::{public_ecr}]",
                CDK_OWNED + "public-ECR read, only in regions with ECR Public, for OCI Helm charts.")
    acknowledge(handler, "AwsSolutions-L1",
                CDK_OWNED + "its runtime is pinned by aws-cdk-lib and tested with the kubectl layer; "
                "it moves with aws-cdk-lib upgrades.")
    framework = provider.node.find_child("Provider").node.find_child("framework-onEvent")
    for policy, why in PROVIDER_FRAMEWORK_POLICIES.items():
        acknowledge(framework, MANAGED.format(policy),
                    CDK_OWNED + f"the custom-resource framework function {why}.")
    handler_arn = stack.get_logical_id(handler.node.default_child)
    acknowledge(framework, f"AwsSolutions-IAM5[Resource::<{handler_arn}.Arn>:*]",
                CDK_OWNED + "the framework may invoke any VERSION of the one kubectl handler "
                "function (the :* is the version qualifier).")


def acknowledge_chart_asset_read(cluster: eks.ICluster) -> None:
    """The read grant aws_eks_v2 gives the kubectl handler on the CDK asset bucket when a Helm
    chart is deployed from a local chart asset (the CRD charts)."""
    stack = cdk.Stack.of(cluster)

    def literal(value: str, pseudo: str) -> str:
        return value if not cdk.Token.is_unresolved(value) else f"<AWS::{pseudo}>"

    bucket = (cdk.DefaultStackSynthesizer.DEFAULT_FILE_ASSETS_BUCKET_NAME
              .replace("${Qualifier}", cdk.DefaultStackSynthesizer.DEFAULT_QUALIFIER)
              .replace("${AWS::AccountId}", literal(stack.account, "AccountId"))
              .replace("${AWS::Region}", literal(stack.region, "Region")))
    handler = cluster.kubectl_provider.node.find_child("Handler")
    why = CDK_OWNED + "its handler downloads the CRD chart archives from the CDK asset bucket: "
    for action in ("s3:GetObject*", "s3:GetBucket*", "s3:List*"):
        acknowledge(handler, f"AwsSolutions-IAM5[Action::{action}]",
                    why + f"{action} is the read set of Asset.grantRead, on that bucket only.")
    acknowledge(handler, f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{bucket}/*]",
                why + "asset object keys are content hashes, unknown until synthesis.")


# --- Rules of our own (the module docstring says why) ------------------------------------------

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
    """The pack: added beside AwsSolutionsChecks (:func:`add_nag_checks`)."""

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
