"""Who may do what on the cluster from the pipeline, and the cdk-nag findings of the pipeline
stack that are acknowledged (each with its reason).

The Smoke, Apply and Promote builds share one IAM role. Its EKS access entry carries NO access policy
(the EKS-managed policies are either cluster-admin or miss KubeRay's custom resources); it maps
the role to a Kubernetes group bound to :data:`DEPLOYER_RULES` in the Ray namespace only.
"""
from __future__ import annotations

from aws_cdk import Stack, aws_ec2 as ec2, aws_eks as eks_l1, aws_eks_v2 as eks, aws_iam as iam, aws_s3 as s3
from constructs import Construct

from environment.contract import REGRESSION_REPORT_DIR as REPORT_DIR
from infra.nag import acknowledge

DEPLOYER_GROUP = "raytrain-pipeline-deployers"
ALL_VERBS = ["get", "list", "watch", "create", "update", "patch", "delete"]
READ_VERBS = ["get", "list", "watch"]
# What `kubectl apply --server-side` of the charts and the smoke run's wait need, in ONE namespace.
DEPLOYER_RULES = [
    {"apiGroups": ["ray.io"], "resources": ["rayjobs", "rayclusters"], "verbs": ALL_VERBS},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ALL_VERBS},
    {"apiGroups": [""], "resources": ["pods", "pods/log", "services", "events"], "verbs": READ_VERBS},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": READ_VERBS},
    # dist/network-policy.k8s.yaml: one policy per Ray cluster, applied with the RayCluster.
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ALL_VERBS},
]


class KubectlDeployer(Construct):
    """The kubectl build role, its access entry, and its namespaced RBAC. Exposes :attr:`role`."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.ICluster, namespace: str,
                 cluster_arn: str, bucket_arn: str, code_prefix: str, runs_prefix: str) -> None:
        super().__init__(scope, construct_id)
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("codebuild.amazonaws.com"),
                             description=f"Pipeline kubectl: RBAC group {DEPLOYER_GROUP} in namespace {namespace}")
        self.role.add_to_policy(iam.PolicyStatement(
            sid="UpdateKubeconfig", actions=["eks:DescribeCluster"], resources=[cluster_arn]))
        # Only in a bucket of this account: never a same-named bucket elsewhere.
        owned = {"StringEquals": {"s3:ResourceAccount": Stack.of(self).account}}
        self.role.add_to_policy(iam.PolicyStatement(
            sid="UploadCodeArchive", actions=["s3:PutObject"], resources=[f"{bucket_arn}/{code_prefix}/*"],
            conditions=owned))
        # The smoke step adds image_ran to run.json; the gate reads both runs' records and
        # metrics and writes the side-by-side report next to the run.
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ReadSmokeRuns", actions=["s3:GetObject"], resources=[
                f"{bucket_arn}/{runs_prefix}/*/run.json", f"{bucket_arn}/{runs_prefix}/*/metrics.jsonl"],
            conditions=owned))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="RecordSmokeImageAndReport", actions=["s3:PutObject"], resources=[
                f"{bucket_arn}/{runs_prefix}/*/run.json", f"{bucket_arn}/{runs_prefix}/*/{REPORT_DIR}/*"],
            conditions=owned))
        self.access_entry = eks_l1.CfnAccessEntry(
            self, "AccessEntry", cluster_name=cluster.cluster_name, principal_arn=self.role.role_arn,
            type="STANDARD", kubernetes_groups=[DEPLOYER_GROUP])
        labels = {"app.kubernetes.io/part-of": "raytrain-eks", "app.kubernetes.io/component": "pipeline"}
        self.rbac = eks.KubernetesManifest(self, "Rbac", cluster=cluster, manifest=[
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": DEPLOYER_GROUP, "namespace": namespace, "labels": labels},
             "rules": DEPLOYER_RULES},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": DEPLOYER_GROUP, "namespace": namespace, "labels": labels},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": DEPLOYER_GROUP},
             "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": DEPLOYER_GROUP}]},
        ])


def private_endpoint_access(scope: Construct, cluster: eks.ICluster) -> dict:
    """For a private API endpoint the kubectl builds run in the cluster's private subnets, in a
    security group the control plane admits on 443 (the rule lives in THIS stack, so the
    cluster stack never references the pipeline). Returns the CodeBuild project arguments."""
    group = ec2.SecurityGroup(scope, "KubectlBuilds", vpc=cluster.vpc, allow_all_outbound=True,
                              description="Pipeline kubectl builds (private EKS endpoint)")
    ec2.CfnSecurityGroupIngress(
        scope, "KubectlBuildsToApi", group_id=cluster.cluster_security_group_id,
        source_security_group_id=group.security_group_id, ip_protocol="tcp", from_port=443, to_port=443,
        description="Pipeline kubectl builds to the EKS API")
    return {"vpc": cluster.vpc, "security_groups": [group],
            "subnet_selection": ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)}


def acknowledge_artifact_bucket(bucket: s3.IBucket) -> None:
    acknowledge(bucket, "AwsSolutions-S1",
                "Pipeline artifacts are transient (expire after 30 days); CodePipeline's execution "
                "history and CloudTrail record who ran what, so access logs add nothing.")


def acknowledge_pipeline(stack: Stack, *, artifacts: s3.IBucket, projects: list,
                        bucket_name: str, code_prefix: str, runs_prefix: str, in_vpc: bool) -> None:
    """The cdk-nag findings of the pipeline stack, each acknowledged ON THE ONE RESOURCE that has
    it and for that exact finding, with its own reason: a new wildcard anywhere in the stack,
    or a known one on another resource, still fails the synth.

    cdk-nag matches acknowledgements by the finding's exact text, so they are spelled out from
    the resources' logical IDs. Every wildcard is confined to a resource of this pipeline; the
    only ``Resource: *`` statements are the ones IAM cannot scope (reasons below).
    """
    def logical_id(construct) -> str:
        return stack.get_logical_id(construct.node.default_child)

    def at(path: str):
        node = stack
        for part in path.split("/"):
            node = node.node.find_child(part)
        return node

    def literal(value: str, pseudo: str) -> str:
        return value if value and not value.startswith("${Token") else f"<AWS::{pseudo}>"

    region, account = literal(stack.region, "Region"), literal(stack.account, "AccountId")
    artifact_objects = f"Resource::<{logical_id(artifacts)}.Arn>/*"
    read = {
        "Action::s3:GetObject*": "reads the input artifacts (source or synthesized templates) of its stage",
        "Action::s3:GetBucket*": "reads the artifact bucket's location and settings (S3 SDK transfers)",
        "Action::s3:List*": "lists the artifact keys of its execution",
        artifact_objects: "touches artifact objects only inside this pipeline's own artifact bucket",
    }
    write = {**read,
             "Action::s3:DeleteObject*": "replaces an output artifact of a retried action",
             "Action::s3:Abort*": "aborts a failed multipart upload of a large artifact"}
    by_owner: dict = {}

    def add(owner, finding: str, reason: str) -> None:
        by_owner.setdefault(owner, {})[finding] = reason

    kubectl_role = at("KubectlDeployer/Role")
    artifact_users = [(at("Pipeline/Role"), "the pipeline", write),
                      (at("Pipeline/Source/Source/CodePipelineActionRole"), "the source action", write)]
    for project in projects:
        owner = project.role
        pid = logical_id(project)
        add(owner, f"Resource::arn:<AWS::Partition>:logs:{region}:{account}:log-group:/aws/codebuild/<{pid}>:*",
            f"Log streams of the {project.node.id} project's own log group (stream names are per build).")
        add(owner, f"Resource::arn:<AWS::Partition>:codebuild:{region}:{account}:report-group/<{pid}>-*",
            f"Test report groups of the {project.node.id} project only (CodeBuild names them per project).")
        artifact_users.append((owner, f"the {project.node.id} build", write if project.node.id == "Synth" else read))
        vpc_policy = project.node.try_find_child("PolicyDocument")
        if vpc_policy is not None:
            add(vpc_policy, "Resource::*", f"CodeBuild's VPC support for {project.node.id} (private endpoint): "
                "ec2:Describe* and CreateNetworkInterface have no resource-level permissions.")
    for owner, who, findings in artifact_users:
        for finding, why in findings.items():
            add(owner, finding, f"CodePipeline artifact access as CDK grants it to {who}: {why}.")
    run_record = f"Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{runs_prefix}/*/run.json"
    add(kubectl_role, run_record, "The smoke build reads the record of the run it started and adds the "
        "image that ran; Promote re-reads it: run.json files under the runs prefix only (the run name is "
        "per execution).")
    add(kubectl_role, f"Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{runs_prefix}/*/metrics.jsonl",
        "The regression gate reads the smoke runs' metrics (the run name is per execution).")
    add(kubectl_role, f"Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{runs_prefix}/*/{REPORT_DIR}/*",
        "The regression gate writes its report next to the smoke run (per execution).")
    add(kubectl_role, f"Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{code_prefix}/*",
        "The apply build uploads the code archive: only under the code prefix (names carry the content hash).")
    if in_vpc:
        add(kubectl_role, "Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:network-interface/*",
            "CodeBuild in the VPC (private endpoint) attaches network interfaces it creates per build; "
            "CDK conditions the permission on the subnets and the CodeBuild service.")
    for owner, findings in by_owner.items():
        for finding, reason in findings.items():
            acknowledge(owner, f"AwsSolutions-IAM5[{finding}]", reason)
    for project in projects:
        acknowledge(project, "AwsSolutions-CB4",
                    f"The {project.node.id} build's artifacts are encrypted at rest with S3-managed keys in "
                    "an SSL-only bucket; they hold synthesized templates and manifests, no secrets.")
