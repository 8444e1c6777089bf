"""The AWS identities of the cluster's workloads, through EKS Pod Identity: the Ray pods'
(:class:`RayIdentity`: the Ray namespace, its network policies, the long-lived cluster's service
account and role, and the role of every run's own service account) and cluster-autoscaler's
(:class:`AutoscalerIdentity`: describe calls on anything, scaling only of this cluster's Auto
Scaling groups).

**Each run its own prefix.** A job on a cluster of its own runs under a service account named
after the run (``charts/ray_charts.py``), associated by ``submit`` with ONE run role (:func:`run_policy_statements`). EKS Pod Identity tags the role session with
the service account's name (``kubernetes-service-account``), and the run role's grants name the
prefix through that tag, ``<prefix>/${aws:PrincipalTag/kubernetes-service-account}/*``: a run's
pods read and write their run's folder only, read the uploaded inputs and the read-only prefixes,
and nothing else. A Pod Identity association names one service account (no pattern), so a
per-run account needs a per-run association: ``submit`` creates it with the operator's rights
(docs/security.md says why this and not a pool of accounts or a role per job class).

**The pipeline's smoke runs** run under one fixed service account (``raytrain-smoke``),
associated here with a role that writes the smoke runs' folders (``smoke-*``) only: the evidence
the pipeline's gate judges is written by the smoke run and the pipeline alone.

**The long-lived RayCluster** (``-on-cluster`` jobs) is one set of pods serving every job that
lands on it: one service account, one role. It runs in single-team mode: its role may read and
write the folders of every run on the long-lived cluster (``on-cluster_<run>``, a name no run
with its own cluster can have), never a run with a cluster of its own, the pipeline's smoke runs
(``smoke-*``) nor the uploaded inputs (explicit Deny statements, which no Allow overrides).

Every statement holds only for a bucket owned by this account (``s3:ResourceAccount``), and
every trust policy only for this cluster's Ray namespace (the session tags EKS Pod Identity
sends, ``aws:RequestTag/eks-cluster-arn`` and ``aws:RequestTag/kubernetes-namespace``, as the
Amazon EKS User Guide's "Create IAM role with trust policy required by EKS Pod Identity" shows).

**Which account a run may name.** The run role's folder is the service account's name, so the
account a RayJob or RayCluster names is its identity; RBAC cannot bound a field of what one may
create, so a ValidatingAdmissionPolicy does (:func:`run_identity_admission`, installed by
:class:`RayIdentity`): a RayJob its own name (unless that is a platform account) or none, the
long-lived RayCluster its account, and only the pipeline's group
(``environment.contract.DEPLOYER_GROUP``) the smoke runs' account; an update may keep the accounts
an object already named, and the KubeRay operator's own copies are not judged.

The namespace comes with its default-deny ingress and the two admitted outside callers
(:func:`environment.network_policy.namespace_policies`), so no Ray pod ever runs unprotected.
"""
from __future__ import annotations

import json

from aws_cdk import Stack, aws_eks_v2 as eks, aws_iam as iam
from constructs import Construct

from environment.contract import (DEPLOYER_GROUP, INPUTS_PREFIX, ON_CLUSTER_FOLDER, PART_OF, PIPELINE_RUN_PREFIX,
                                  POD_SECURITY_LABELS, RUN_TAG, SMOKE_SERVICE_ACCOUNT, run_role_name)
from environment.network_policy import namespace_policies
from infra.nag import acknowledge

# Object-level actions Ray Train's pyarrow S3 filesystem uses for checkpoints: read, write,
# delete (num_to_keep prunes old checkpoints), and the multipart calls big uploads need.
OBJECT_ACTIONS = (
    "s3:GetObject",
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
)


def same_account(account: str) -> dict:
    """The condition that pins S3 access to buckets owned by ``account``."""
    return {"StringEquals": {"s3:ResourceAccount": account}}


RUN_FOLDER = "${aws:PrincipalTag/%s}" % RUN_TAG
"""An IAM policy variable: the session tag EKS Pod Identity sets to the service account's name."""
TRACKING_ACTIONS = ("sagemaker-mlflow:*",)
"""Every action of SageMaker with MLflow (Service Authorization Reference, service prefix
``sagemaker-mlflow``), granted on the one tracking server ARN: only the actions whose resource
type is ``mlflow-tracking-server`` can apply (``AccessUI`` has none, so it is not granted)."""


def checkpoint_policy_statements(bucket_arn: str, prefix: str, account: str,
                                 read_only_prefixes: tuple[str, ...] = ()) -> list[iam.PolicyStatement]:
    """The long-lived cluster's role (single-team mode): read/write the folders of every run on
    the long-lived cluster (:data:`ON_CLUSTER_FOLDER`), read-only on a few others; never a run
    with a cluster of its own, the pipeline's smoke runs nor the uploaded inputs."""
    owned = same_account(account)
    statements = [
        iam.PolicyStatement(
            sid="OnClusterRunObjects", actions=list(OBJECT_ACTIONS),
            resources=[f"{bucket_arn}/{prefix}/{ON_CLUSTER_FOLDER}*"], conditions=owned),
        _never_evidence_or_inputs(bucket_arn, prefix),
    ]
    return [*statements, *_reads(bucket_arn, prefix, owned, read_only_prefixes)]


def run_policy_statements(bucket_arn: str, prefix: str, account: str, read_only_prefixes: tuple[str, ...] = (),
                          tracking_server_arn: str = "") -> list[iam.PolicyStatement]:
    """The run role: each run's pods read and write their own run folder only (the session tag
    names it), read the inputs submit uploaded and the read-only prefixes; MLflow on the one
    tracking server when the spec names one."""
    owned = same_account(account)
    statements = [
        iam.PolicyStatement(
            sid="OwnRunObjects", actions=list(OBJECT_ACTIONS),
            resources=[f"{bucket_arn}/{prefix}/{RUN_FOLDER}/*"], conditions=owned),
        # Run names admit "smoke-<execution>-<build>": the session tag would then name a smoke
        # run's folder, which the Allow above covers.
        _never_evidence_or_inputs(bucket_arn, prefix),
        *_reads(bucket_arn, prefix, owned, read_only_prefixes),
    ]
    if tracking_server_arn:
        statements.append(iam.PolicyStatement(
            sid="TrackingServer", actions=list(TRACKING_ACTIONS), resources=[tracking_server_arn]))
    return statements


def _never_evidence_or_inputs(bucket_arn: str, prefix: str) -> iam.PolicyStatement:
    # The evidence the pipeline's gate judges, and what submit uploaded for other runs:
    # an explicit Deny wins over every Allow (IAM policy evaluation logic).
    return iam.PolicyStatement(
        sid="NeverPipelineEvidenceOrInputs", effect=iam.Effect.DENY,
        actions=["s3:PutObject", "s3:DeleteObject"],
        resources=[f"{bucket_arn}/{prefix}/{PIPELINE_RUN_PREFIX}*", f"{bucket_arn}/{prefix}/{INPUTS_PREFIX}/*"])


def smoke_policy_statements(bucket_arn: str, prefix: str, account: str, read_only_prefixes: tuple[str, ...] = (),
                            tracking_server_arn: str = "") -> list[iam.PolicyStatement]:
    """The pipeline's smoke runs (one service account, :data:`SMOKE_SERVICE_ACCOUNT`): read and
    write the smoke runs' folders only, read the inputs, as a run does."""
    owned = same_account(account)
    statements = [
        iam.PolicyStatement(
            sid="SmokeRunObjects", actions=list(OBJECT_ACTIONS),
            resources=[f"{bucket_arn}/{prefix}/{PIPELINE_RUN_PREFIX}*"], conditions=owned),
        *_reads(bucket_arn, prefix, owned, read_only_prefixes),
    ]
    if tracking_server_arn:
        statements.append(iam.PolicyStatement(
            sid="TrackingServer", actions=list(TRACKING_ACTIONS), resources=[tracking_server_arn]))
    return statements


def _reads(bucket_arn: str, prefix: str, owned: dict, read_only_prefixes: tuple[str, ...]) -> list[iam.PolicyStatement]:
    # Ray's runtime-env agent downloads the code archive (working_dir) with the pod's
    # credentials; jobs read their base model and data from here, and what submit uploaded
    # (content-addressed, written by people who submit, never by a pod).
    statements = [iam.PolicyStatement(
        sid="ReadJobInputs", actions=["s3:GetObject"],
        resources=[f"{bucket_arn}/{p}/*" for p in read_only_prefixes] + [f"{bucket_arn}/{prefix}/{INPUTS_PREFIX}/*"],
        conditions=owned)]
    statements.append(iam.PolicyStatement(
        # On the one bucket, without an s3:prefix condition: HeadBucket (pyarrow's and Ray's
        # "does the bucket exist" check before every write) is authorised by s3:ListBucket and
        # sends no prefix, so a prefix-conditioned grant would deny it and every run would fail
        # at start. Listing reveals key names only; objects stay confined to the prefixes above.
        sid="ListCheckpointBucket", actions=["s3:ListBucket"], resources=[bucket_arn], conditions=owned))
    return statements


def pod_identity_trust(cluster_arn: str, namespace: str, service_account: str = "") -> iam.IPrincipal:
    """EKS Pod Identity (AssumeRole with session tags), for pods of this cluster's ``namespace``
    only (and of one ``service_account`` where given)."""
    tags = {"aws:RequestTag/eks-cluster-arn": cluster_arn, "aws:RequestTag/kubernetes-namespace": namespace,
            **({f"aws:RequestTag/{RUN_TAG}": service_account} if service_account else {})}
    return iam.SessionTagsPrincipal(iam.ServicePrincipal("pods.eks.amazonaws.com")).with_conditions(
        {"StringEquals": tags})


def _cel(value: str) -> str:
    """A CEL string literal (JSON's escapes are CEL's)."""
    return json.dumps(value)


def _accounts_cel(obj: str) -> str:
    """The service accounts a RayJob's or RayCluster's pod templates name ('' where none is
    named), as a CEL list: head, every worker group, the submitter. Every step is an optional
    field (``.?``): a cluster without ``workerGroupSpecs``, a RayJob on the long-lived cluster
    (``clusterSelector``, no ``rayClusterSpec``) or without ``submitterPodTemplate`` evaluates."""
    def named(template: str) -> str:
        return f"{template}.?template.?spec.?serviceAccountName.orValue('')"
    cluster = f"({obj}.kind == 'RayCluster' ? {obj}.?spec : {obj}.?spec.?rayClusterSpec)"
    return (f"({cluster}.hasValue() ? [{named(cluster + '.value().?headGroupSpec')}] + "
            f"{cluster}.value().?workerGroupSpecs.orValue([]).map(g, {named('g')}) : []) + "
            f"({obj}.kind == 'RayJob' ? [{obj}.?spec.?submitterPodTemplate.?spec.?serviceAccountName.orValue('')] : [])")


def run_identity_admission(*, namespace: str, raycluster_name: str, cluster_account: str,
                           operator_namespace: str, pipeline_group: str) -> list[dict]:
    """A ValidatingAdmissionPolicy and its binding (admissionregistration.k8s.io/v1, GA since
    Kubernetes 1.30) that keep every RayJob and RayCluster of the Ray namespace on the service
    account it is entitled to. Pod Identity hands a pod the role of the service account it names
    and the run role's folder is that account's name, so a RayJob naming another run's account
    would run as that run; RBAC cannot bound a field of what one may create.

    Entitled: no account at all (the namespace's ``default``, which no association names); a
    RayJob its own name (the run: ``submit`` names the account after it, ``charts/ray_charts.py``)
    unless that name is one of the platform's accounts; the long-lived RayCluster
    (``raycluster_name``) ``cluster_account``; the pipeline's group the smoke runs' account. An
    update may keep the accounts the object already named (Kueue unsuspends, the Ray autoscaler
    patches replicas). The KubeRay operator is not judged: the RayCluster and submitter Job it
    makes copy a RayJob already judged here."""
    platform = [cluster_account, SMOKE_SERVICE_ACCOUNT]
    name = f"{namespace}-run-service-accounts"
    labels = dict(PART_OF)
    entitled = (f"[''] + (object.metadata.name in {json.dumps(platform)} || object.kind != 'RayJob' ? [] : "
                f"[object.metadata.name]) + (object.kind == 'RayCluster' && object.metadata.name == "
                f"{_cel(raycluster_name)} ? [{_cel(cluster_account)}] : []) + (object.kind == 'RayJob' && "
                f"{_cel(pipeline_group)} in request.userInfo.?groups.orValue([]) ? [{_cel(SMOKE_SERVICE_ACCOUNT)}] : [])")
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["ray.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                "resources": ["rayjobs", "rayclusters"]}]},
            "matchConditions": [{
                "name": "not-the-kuberay-operator",
                "expression": f"!request.userInfo.username.startsWith({_cel(f'system:serviceaccount:{operator_namespace}:')})"}],
            "variables": [
                {"name": "accounts", "expression": _accounts_cel("object")},
                {"name": "oldAccounts", "expression": f"oldObject == null ? [] : {_accounts_cel('oldObject')}"},
                {"name": "entitled", "expression": entitled},
                {"name": "borrowed", "expression":
                    "variables.accounts.filter(a, !(a in variables.entitled) && !(a in variables.oldAccounts))"},
            ],
            "validations": [{
                "expression": "size(variables.borrowed) == 0",
                "messageExpression": (
                    "object.kind + ' ' + object.metadata.name + ': serviceAccountName ' + "
                    "variables.borrowed.map(a, \"'\" + a + \"'\").join(', ') + ' is not its own: a RayJob\\'s pods "
                    "run as the service account named after the run (' + "
                    "(object.kind == 'RayJob' ? \"'\" + object.metadata.name + \"'\" : 'none here') + ') or name none'"),
                "reason": "Forbidden"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": labels},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}},
    }
    return [policy, binding]


class RayIdentity(Construct):
    """Namespace + the long-lived cluster's service account, role and Pod Identity association +
    the run role (no association: one per run, made by ``submit``). Exposes :attr:`role`,
    :attr:`run_role`, :attr:`manifest`, :attr:`association`, :attr:`namespace` and
    :attr:`service_account_name`.

    Built from parts instead of ``cluster.add_service_account(identity_type=POD_IDENTITY)``:
    that helper also annotates the service account with the IRSA ``eks.amazonaws.com/role-arn``,
    and an IRSA web-identity token comes first in the AWS SDKs' credential chain, for a role
    whose trust policy (rightly) does not accept it.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.ICluster, cluster_name: str,
                 namespace: str, service_account_name: str, bucket_name: str, prefix: str,
                 pod_identity_agent: Construct | None, operator_namespace: str, raycluster_name: str,
                 read_only_prefixes: tuple[str, ...] = (), tracking_server_arn: str = "") -> None:
        super().__init__(scope, construct_id)
        self.namespace = namespace
        self.service_account_name = service_account_name
        labels = dict(PART_OF)
        # One manifest, applied in order: the namespace, its network policies, then the service
        # account (no token automount: nothing in the Ray pods calls the Kubernetes API).
        self.network_policies = namespace_policies(namespace, operator_namespace)
        self.manifest = cluster.add_manifest(
            "RayNamespaceAndServiceAccount",
            # Pod Security: baseline enforced, restricted warned and audited.
            {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": namespace, "labels": {**labels, **POD_SECURITY_LABELS}}},
            *self.network_policies,
            *({"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": False,
               "metadata": {"name": name, "namespace": namespace, "labels": labels}}
              for name in (service_account_name, SMOKE_SERVICE_ACCOUNT)))
        # Every run's pods on the account it is entitled to: the run roles' folders follow the
        # account's name, so the name is what admission guards (:func:`run_identity_admission`).
        self.admission = cluster.add_manifest("RunServiceAccounts", *run_identity_admission(
            namespace=namespace, raycluster_name=raycluster_name, cluster_account=service_account_name,
            operator_namespace=operator_namespace, pipeline_group=DEPLOYER_GROUP))
        self.admission.node.add_dependency(self.manifest)
        stack = Stack.of(self)
        # Built from the spec's name: the same string the session tag carries (an imported
        # cluster's attribute would be a token of another stack).
        cluster_arn = stack.format_arn(service="eks", resource="cluster", resource_name=cluster_name)
        trust = pod_identity_trust(cluster_arn, namespace)
        self.role = iam.Role(
            self, "PodRole", assumed_by=pod_identity_trust(cluster_arn, namespace, service_account_name),
            description=f"Ray pods of the long-lived cluster ({namespace}/{service_account_name}): every run "
                        "on it (single-team), never another run, the pipeline's smoke runs or the uploaded inputs")
        self.association = eks.CfnPodIdentityAssociation(
            self, "Association", cluster_name=cluster.cluster_name, namespace=namespace,
            service_account=service_account_name, role_arn=self.role.role_arn)
        if pod_identity_agent is not None:  # None: an existing cluster's agent (verify checks it)
            self.association.node.add_dependency(pod_identity_agent)
        # The pipeline's smoke runs: one fixed account, associated here (the pipeline's builds
        # need no right to create associations); its role writes the smoke runs' folders only.
        self.smoke_role = iam.Role(
            self, "SmokeRole", assumed_by=pod_identity_trust(cluster_arn, namespace, SMOKE_SERVICE_ACCOUNT),
            description=f"The pipeline's smoke runs ({namespace}/{SMOKE_SERVICE_ACCOUNT}): their folders only")
        self.smoke_association = eks.CfnPodIdentityAssociation(
            self, "SmokeAssociation", cluster_name=cluster.cluster_name, namespace=namespace,
            service_account=SMOKE_SERVICE_ACCOUNT, role_arn=self.smoke_role.role_arn)
        if pod_identity_agent is not None:
            self.smoke_association.node.add_dependency(pod_identity_agent)
        self.run_role = iam.Role(
            self, "RunRole", role_name=run_role_name(cluster_name), assumed_by=trust,
            description=f"Each run's own pods ({namespace}/<run>): their run's folder only, read-only inputs")
        # The bucket lives in the storage stack; its name is spec-derived, so the ARN is built
        # here instead of imported (no cross-stack export pins the stateful stack).
        bucket_arn = f"arn:{stack.partition}:s3:::{bucket_name}"
        self.policy = iam.Policy(self, "CheckpointAccess", statements=checkpoint_policy_statements(
            bucket_arn, prefix, stack.account, read_only_prefixes))
        self.policy.attach_to_role(self.role)
        self.run_policy = iam.Policy(self, "RunAccess", statements=run_policy_statements(
            bucket_arn, prefix, stack.account, read_only_prefixes, tracking_server_arn))
        self.run_policy.attach_to_role(self.run_role)
        self.smoke_policy = iam.Policy(self, "SmokeAccess", statements=smoke_policy_statements(
            bucket_arn, prefix, stack.account, read_only_prefixes, tracking_server_arn))
        self.smoke_policy.attach_to_role(self.smoke_role)
        acknowledge(
            self.smoke_policy,
            f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{prefix}/{PIPELINE_RUN_PREFIX}*]",
            "The pipeline's smoke runs, one folder per build named smoke-<execution>-<build>: the wildcard "
            "covers those folders only, which no other pod identity may write.")
        if tracking_server_arn:
            # The long-lived cluster's jobs log to the same server.
            self.policy.add_statements(iam.PolicyStatement(
                sid="TrackingServer", actions=list(TRACKING_ACTIONS), resources=[tracking_server_arn]))
        acknowledge(
            self.policy,
            f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{prefix}/{ON_CLUSTER_FOLDER}*]",
            "Single-team mode of the long-lived cluster: its pods serve every -on-cluster job; the "
            "wildcard covers those runs' folders only, never a run with a cluster of its own.")
        acknowledge(
            self.run_policy,
            # cdk-nag names a policy variable ${aws:X} as <aws:X> in its finding ids.
            f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{prefix}/<aws:PrincipalTag/{RUN_TAG}>/*]",
            "One run's own folder: the policy variable is the run's service account, set by EKS Pod "
            "Identity's session tag; the wildcard covers the keys the run creates there.")
        for policy, whose in ((self.policy, "the long-lived cluster's pods"), (self.run_policy, "each run's own pods"),
                              (self.smoke_policy, "the pipeline's smoke runs")):
            for ro in (*read_only_prefixes, f"{prefix}/{INPUTS_PREFIX}"):
                acknowledge(
                    policy, f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{ro}/*]",
                    f"Read-only (s3:GetObject) for {whose} on the '{ro}/' inputs prefix of the one bucket: "
                    "content-addressed code archives, uploaded inputs, base models and datasets named at run time.")
            if tracking_server_arn:
                acknowledge(policy, "AwsSolutions-IAM5[Action::sagemaker-mlflow:*]",
                            f"Every MLflow action for {whose} on the one tracking server the spec names "
                            "(resource-level; AccessUI, which has no resource type, is not granted).")


# cluster-autoscaler's AWS README ("Full Cluster Autoscaler Features Policy").
READ_ACTIONS = (
    "autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
    "autoscaling:DescribeLaunchConfigurations", "autoscaling:DescribeScalingActivities",
    "autoscaling:DescribeTags", "ec2:DescribeImages", "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplateVersions", "ec2:GetInstanceTypesFromInstanceRequirements",
    "eks:DescribeNodegroup",
)
WRITE_ACTIONS = ("autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup")


class AutoscalerIdentity(Construct):
    """Role + Pod Identity association for ``kube-system/<service_account>``."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.ICluster, cluster_name: str,
                 namespace: str, service_account: str) -> None:
        super().__init__(scope, construct_id)
        self.role = iam.Role(
            self, "Role", description=f"cluster-autoscaler of EKS cluster {cluster_name}",
            assumed_by=pod_identity_trust(
                Stack.of(self).format_arn(service="eks", resource="cluster", resource_name=cluster_name), namespace))
        policy = iam.Policy(self, "Scaling", statements=[
            iam.PolicyStatement(sid="Describe", actions=list(READ_ACTIONS), resources=["*"]),
            # EKS tags every managed node group's ASG with k8s.io/cluster-autoscaler/<cluster>.
            iam.PolicyStatement(
                sid="ScaleThisClustersGroups", actions=list(WRITE_ACTIONS), resources=["*"],
                conditions={"StringEquals": {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster_name}": "owned"}}),
        ])
        policy.attach_to_role(self.role)
        acknowledge(policy, "AwsSolutions-IAM5[Resource::*]",
                    "Describe calls have no resource-level permissions; the two scaling actions "
                    "are limited by condition to Auto Scaling groups tagged as this cluster's.")
        self.association = eks.CfnPodIdentityAssociation(
            self, "Association", cluster_name=cluster.cluster_name, namespace=namespace,
            service_account=service_account, role_arn=self.role.role_arn)
