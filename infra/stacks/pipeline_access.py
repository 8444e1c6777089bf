"""Who may do what on the cluster from the pipeline, and the cdk-nag findings of the pipeline
stack that are acknowledged (each with its reason).

The Smoke, Apply and Promote builds have one IAM role each (:class:`KubectlDeployers`). Their EKS
access entries carry NO access policy (the EKS-managed policies are either cluster-admin or miss
KubeRay's custom resources); each maps its role to the Kubernetes group ``DEPLOYER_GROUP``
(named in environment/contract.py: the admission policy of infra/constructs/pod_identity.py lets
that group name the smoke runs' service account), bound to :data:`DEPLOYER_RULES` in the Ray namespace only, by the
builder the people who submit get theirs from (infra/constructs/submitter_access.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Stack, aws_ec2 as ec2, aws_eks as eks_l1, aws_eks_v2 as eks, aws_iam as iam, aws_s3 as s3
from constructs import Construct

from environment.contract import DEPLOYER_GROUP, REGRESSION_REPORT_DIR as REPORT_DIR, stack_name
from infra.constructs.submitter_access import namespace_group_rbac
from infra.nag import acknowledge

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
    # The smoke RayJob's place in Kueue's queue while it waits (raytrain_eks/backends/kueue_queue.py).
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": READ_VERBS},
]


SMOKE_RUNS = "smoke-*"
"""The smoke runs' folders under the runs prefix (raytrain_eks/pipeline/smoke.py run_name)."""
STEPS = ("Smoke", "Apply", "Promote")
"""The kubectl builds, one IAM role each: only Promote may write the promoted digest."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineResources:
    """What the kubectl builds touch, as IAM resources and keys."""

    cluster_arn: str
    bucket_arn: str
    code_prefix: str
    runs_prefix: str
    table_arn: str
    history_key: str
    """The history partition (``repository:tag``): the only one Smoke and Apply may write."""
    pointer_key: str
    """The promoted-digest item's partition: Promote's alone."""
    parameter_arn: str
    topic_arn: str
    cache_prefix: str = ""
    """The pull-through cache rule's repository prefix ('' without ``image.pull_through_cache``):
    Smoke warms the cache by tag there before its pods pull the new digest (raytrain_eks/pipeline/smoke.py)."""


class KubectlDeployers(Construct):
    """The kubectl builds' roles (:attr:`roles`: ``Smoke``, ``Apply``, ``Promote``), their access
    entries, and the one namespaced RBAC group they share.

    Least privilege by stage: every role may read the promoted digest and history, record
    history items in the image's own partition (``dynamodb:LeadingKeys``: never the
    promoted-digest item, which lives in a partition of its own), publish failures and roll the
    long-lived cluster back. Smoke may also write its run's record and report and upload the
    code archive; Apply upload the code archive; Promote alone may swap the promoted-digest item
    and write the SSM parameter, and reads the smoke record by version.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.ICluster, namespace: str,
                 resources: PipelineResources) -> None:
        super().__init__(scope, construct_id)
        r = resources
        # Only in a bucket of this account: never a same-named bucket elsewhere.
        owned = {"StringEquals": {"s3:ResourceAccount": Stack.of(self).account}}
        runs = f"{r.bucket_arn}/{r.runs_prefix}/{SMOKE_RUNS}"
        self.roles: dict[str, iam.Role] = {}
        for step in STEPS:
            role = iam.Role(self, f"{step}Role", assumed_by=iam.ServicePrincipal("codebuild.amazonaws.com"),
                            description=f"Pipeline {step} build: RBAC group {DEPLOYER_GROUP} in namespace {namespace}")
            for statement in (
                iam.PolicyStatement(sid="UpdateKubeconfig", actions=["eks:DescribeCluster"], resources=[r.cluster_arn]),
                iam.PolicyStatement(sid="ReadPromotedDigest", actions=["ssm:GetParameter"], resources=[r.parameter_arn]),
                iam.PolicyStatement(sid="ReadHistory", actions=["dynamodb:Query", "dynamodb:GetItem"],
                                    resources=[r.table_arn]),
                # applied / rolled-back items; the promoted-digest item is in another partition
                iam.PolicyStatement(sid="RecordHistory", actions=["dynamodb:PutItem"], resources=[r.table_arn],
                                    conditions={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [r.history_key]}}),
                iam.PolicyStatement(sid="NotifyFailures", actions=["sns:Publish"], resources=[r.topic_arn]),
            ):
                role.add_to_policy(statement)
            self.roles[step] = role
            eks_l1.CfnAccessEntry(self, f"{step}AccessEntry", cluster_name=cluster.cluster_name,
                                  principal_arn=role.role_arn, type="STANDARD", kubernetes_groups=[DEPLOYER_GROUP])
        for step in ("Smoke", "Apply"):
            self.roles[step].add_to_policy(iam.PolicyStatement(
                sid="UploadCodeArchive", actions=["s3:PutObject"], resources=[f"{r.bucket_arn}/{r.code_prefix}/*"],
                conditions=owned))
        for step in ("Smoke", "Promote"):
            # ListBucket: S3 then answers a missing record with 404, so a 403 means unreadable
            # (a baseline the gate cannot read fails it instead of being skipped as missing).
            self.roles[step].add_to_policy(iam.PolicyStatement(
                sid="TellMissingFromDenied", actions=["s3:ListBucket"], resources=[r.bucket_arn], conditions=owned))
        smoke, promote = self.roles["Smoke"], self.roles["Promote"]
        # The smoke step adds image_ran to run.json; the gate reads both runs' records and
        # metrics and writes the side-by-side report next to the run.
        smoke.add_to_policy(iam.PolicyStatement(
            sid="ReadSmokeRuns", actions=["s3:GetObject", "s3:GetObjectVersion"],
            resources=[f"{runs}/run.json", f"{runs}/metrics.jsonl"], conditions=owned))
        smoke.add_to_policy(iam.PolicyStatement(
            sid="RecordSmokeImageAndReport", actions=["s3:PutObject"],
            resources=[f"{runs}/run.json", f"{runs}/{REPORT_DIR}/*"], conditions=owned))
        if r.cache_prefix:
            # warm_cache: a registry GET of the manifest by tag through the cache rule, as a node's
            # pull (the node role's statements, infra/stacks/cluster.py PullThroughCache)
            smoke.add_to_policy(iam.PolicyStatement(
                sid="RegistryLogin", actions=["ecr:GetAuthorizationToken"], resources=["*"]))
            smoke.add_to_policy(iam.PolicyStatement(
                sid="WarmPullThroughCache",
                actions=["ecr:BatchGetImage", "ecr:BatchImportUpstreamImage", "ecr:CreateRepository"],
                resources=[Stack.of(self).format_arn(service="ecr", resource="repository",
                                                     resource_name=f"{r.cache_prefix}/*")]))
        if r.cache_prefix:
            # keep_in_cache: the promoted digest tagged in the cache's repository, which its
            # lifecycle policy keeps (raytrain_eks/pipeline/apply_promote.py)
            promote.add_to_policy(iam.PolicyStatement(
                sid="TagPromotedInCache", actions=["ecr:BatchGetImage", "ecr:PutImage"],
                resources=[Stack.of(self).format_arn(service="ecr", resource="repository",
                                                     resource_name=f"{r.cache_prefix}/*")]))
        promote.add_to_policy(iam.PolicyStatement(
            sid="ReadJudgedRecord", actions=["s3:GetObject", "s3:GetObjectVersion"], resources=[f"{runs}/run.json"],
            conditions=owned))
        # The compare-and-swap: a transaction of UpdateItem (the promoted-digest item) + PutItem
        # (the history item, RecordHistory above); then the SSM parameter.
        promote.add_to_policy(iam.PolicyStatement(
            sid="SwapPromotedDigest", actions=["dynamodb:UpdateItem"], resources=[r.table_arn],
            conditions={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [r.pointer_key]}}))
        promote.add_to_policy(iam.PolicyStatement(
            sid="WritePromotedDigest", actions=["ssm:PutParameter"], resources=[r.parameter_arn]))
        self.rbac = eks.KubernetesManifest(self, "Rbac", cluster=cluster, manifest=namespace_group_rbac(
            DEPLOYER_GROUP, namespace, DEPLOYER_RULES, "pipeline"))


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
                        bucket_name: str, code_prefix: str, runs_prefix: str, in_vpc: bool,
                        cluster_name: str, cache_prefix: str = "") -> None:
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
        if project.node.id == "DeployStacks":
            add(owner, f"Resource::arn:<AWS::Partition>:eks:{region}:{account}:nodegroup/{cluster_name}/*/*",
                "record-groups describes this cluster's node groups (generated names: the GPU groups it "
                "finds by their tags) before the deploy; read-only.")
            add(owner, f"Resource::arn:<AWS::Partition>:cloudformation:{region}:{account}:stack/{stack_name(cluster_name, 'cluster')}/*",
                "record-groups and app.py read the cluster stack's state (its StackId, generated per creation, "
                "and last change) the GPU groups are recorded at; DescribeStacks only.")
        vpc_policy = project.node.try_find_child("PolicyDocument")
        if vpc_policy is not None:
            add(vpc_policy, "Resource::*", f"CodeBuild's VPC support for {project.node.id} (private endpoint): "
                "ec2:Describe* and CreateNetworkInterface have no resource-level permissions.")
    for owner, who, findings in artifact_users:
        for finding, why in findings.items():
            add(owner, finding, f"CodePipeline artifact access as CDK grants it to {who}: {why}.")
    roles = {step: at(f"KubectlDeployers/{step}Role") for step in STEPS}
    runs = f"Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{runs_prefix}/{SMOKE_RUNS}"
    add(roles["Smoke"], f"{runs}/run.json", "The smoke build reads the record of the run it started and adds the "
        "image that ran; the gate reads the promoted run's: smoke runs' run.json only (the run name is per build).")
    add(roles["Promote"], f"{runs}/run.json", "Promote re-reads the version of the smoke record the gate judged "
        "(the run name is per build; Promote checks it is this execution's).")
    add(roles["Smoke"], f"{runs}/metrics.jsonl", "The regression gate reads the smoke runs' metrics (per build).")
    add(roles["Smoke"], f"{runs}/{REPORT_DIR}/*", "The regression gate writes its report next to the smoke run.")
    add(roles["Apply"], f"Resource::arn:<AWS::Partition>:cloudformation:{region}:{account}:stack/"
        f"{stack_name(cluster_name, 'cluster')}/*",
        "HoldDeploy (in Apply's role) reads the deployed cluster template to see whether the deploy rolls or "
        "replaces a GPU node group; GetTemplate of that one stack (its StackId suffix is generated).")
    if cache_prefix:
        add(roles["Smoke"], "Resource::*", "ecr:GetAuthorizationToken has no resource-level permissions (the "
            "registry login before Smoke warms the pull-through cache by tag).")
        add(roles["Smoke"], f"Resource::arn:<AWS::Partition>:ecr:{region}:{account}:repository/{cache_prefix}/*",
            f"Smoke warms the pull-through cache: the cache makes one repository per upstream image under "
            f"{cache_prefix}/ on the first pull (names not known before).")
        add(roles["Promote"], f"Resource::arn:<AWS::Partition>:ecr:{region}:{account}:repository/{cache_prefix}/*",
            f"Promote tags the digest it promotes in the pull-through cache's repository, under {cache_prefix}/ "
            "(made by the cache on the first pull: names not known before), so its lifecycle policy keeps it.")
    for step in ("Smoke", "Apply"):
        add(roles[step], f"Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{code_prefix}/*",
            "The build uploads the code archive: only under the code prefix (names carry the content hash).")
    if in_vpc:
        for role in roles.values():
            add(role, "Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:network-interface/*",
                "CodeBuild in the VPC (private endpoint) attaches network interfaces it creates per build; "
                "CDK conditions the permission on the subnets and the CodeBuild service.")
    for owner, findings in by_owner.items():
        for finding, reason in findings.items():
            acknowledge(owner, f"AwsSolutions-IAM5[{finding}]", reason)
    for project in projects:
        acknowledge(project, "AwsSolutions-CB4",
                    f"The {project.node.id} build's artifacts are encrypted at rest with S3-managed keys in "
                    "an SSL-only bucket; they hold synthesized templates and manifests, no secrets.")
