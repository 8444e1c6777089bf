"""The people who only submit (``cluster.submitter_principal_arns``), and what they may do:
``raytrain-eks submit/status/logs/stop/list`` against the cluster and its bucket, nothing else.

Kubernetes side: each person an EKS access entry with NO access policy (the EKS-managed policies
are either cluster-admin or miss KubeRay's custom resources), mapped to :data:`SUBMITTERS_GROUP`,
which is bound to :data:`SUBMITTER_RULES` in the Ray namespace only (:func:`namespace_group_rbac`,
the same shape the pipeline's kubectl builds get in infra/stacks/pipeline_access.py). Admins stay
cluster-admin, apart. Which service account a submitted RayJob may name is not RBAC's to bound:
the admission policy of infra/constructs/pod_identity.py does it.

AWS side: one IAM managed policy to attach to them (output ``SubmitRunsPolicyArn``): the
kubeconfig, the code archive and inputs uploaded, the runs read, and a run's own Pod Identity
association made and removed (``iam:PassRole`` of the run role, to EKS Pod Identity only).
"""
from __future__ import annotations

import hashlib

from aws_cdk import CfnOutput, Stack, Token, aws_eks as eks_l1, aws_eks_v2 as eks, aws_iam as iam
from constructs import Construct

from environment.contract import INPUTS_PREFIX, PART_OF, SUBMITTERS_GROUP
from infra.constructs.pod_identity import same_account
from infra.nag import acknowledge


def namespace_group_rbac(group: str, namespace: str, rules: list[dict], component: str) -> list[dict]:
    """A Role of ``rules`` in ``namespace`` and its binding to the Kubernetes ``group``, both
    named after the group: the whole Kubernetes side of an access entry with no access policy
    (people who submit, the pipeline's builds), never a ClusterRole."""
    labels = {**PART_OF, "app.kubernetes.io/component": component}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": group, "namespace": namespace, "labels": labels}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": group, "namespace": namespace, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": group},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]},
    ]


SUBMITTER_RULES = [
    # submit applies, follows and deletes its RayJob; stop deletes it
    {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["get", "list", "watch", "create", "update",
                                                                 "patch", "delete"]},
    {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "list", "watch"]},
    # the run's own service account; its cluster's network policy, created when missing. No patch
    # or delete: a create cannot be bounded by resourceNames, so one who may patch or delete a
    # run's policy may patch or delete the namespace's default deny too. stop leaves it for them.
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "create"]},
    # following: pods waiting for nodes and images, the submitter's log, events
    {"apiGroups": [""], "resources": ["pods", "pods/log", "events", "services"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]},
    # the run's place in Kueue's queue (raytrain_eks/backends/kueue_queue.py)
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues", "workloads"], "verbs": ["get", "list", "watch"]},
]
"""What ``raytrain-eks submit/status/logs/stop/list`` do in the Ray namespace, and nothing else:
no Secret (the Ray token stays with KubeRay), no pod exec, no other namespace."""


def _nag(value: str, pseudo: str) -> str:
    """How cdk-nag writes a value in a finding's id: the literal, or ``<AWS::...>`` for a token."""
    return f"<{pseudo}>" if Token.is_unresolved(value) else value


class SubmitterAccess(Construct):
    """The people who only submit (``cluster.submitter_principal_arns``): each an EKS access entry
    with NO access policy, mapped to :data:`SUBMITTERS_GROUP`, bound to :data:`SUBMITTER_RULES` in
    the Ray namespace only (admins stay cluster-admin, apart). And :attr:`policy`, the IAM managed
    policy to attach to them for the AWS side of ``submit`` (output ``SubmitRunsPolicyArn``):
    upload the code archive and inputs, read the runs, make and remove a run's Pod Identity
    association with the run role (``iam:PassRole`` of that role, to EKS Pod Identity only)."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.ICluster, cluster_name: str,
                 namespace: str, principals: tuple[str, ...], bucket_name: str, prefix: str, code_prefix: str,
                 run_role: iam.IRole) -> None:
        super().__init__(scope, construct_id)
        self.manifest = cluster.add_manifest(
            "SubmitterRbac", *namespace_group_rbac(SUBMITTERS_GROUP, namespace, SUBMITTER_RULES, "submitters"))
        self.entries = [eks_l1.CfnAccessEntry(self, "Submitter" + hashlib.sha256(arn.encode()).hexdigest()[:12],
                                              cluster_name=cluster.cluster_name, principal_arn=arn, type="STANDARD",
                                              kubernetes_groups=[SUBMITTERS_GROUP])
                        for arn in principals]
        stack = Stack.of(self)
        cluster_arn = stack.format_arn(service="eks", resource="cluster", resource_name=cluster_name)
        bucket_arn = f"arn:{stack.partition}:s3:::{bucket_name}"
        owned = same_account(stack.account)
        association_arn = stack.format_arn(service="eks", resource="podidentityassociation",
                                           resource_name=f"{cluster_name}/*")
        self.policy = iam.ManagedPolicy(self, "SubmitRuns", description=(
            f"Submit runs to EKS cluster {cluster_name}: its Ray namespace through kubectl (access entry), the "
            "bucket's code, inputs and runs, a run's own Pod Identity association"), statements=[
            iam.PolicyStatement(sid="Kubeconfig", actions=["eks:DescribeCluster"], resources=[cluster_arn]),
            iam.PolicyStatement(sid="RunIdentity", actions=["eks:CreatePodIdentityAssociation",
                                                            "eks:ListPodIdentityAssociations"],
                                resources=[cluster_arn]),
            # Describe: the list's summaries name no role, and a run named like another role's
            # account must neither borrow nor delete that association.
            iam.PolicyStatement(sid="DescribeRunIdentity", actions=["eks:DescribePodIdentityAssociation"],
                                resources=[association_arn]),
            # Only associations submit made (it tags each, raytrain_eks/backends/eks.py): the
            # podidentityassociation resource type takes aws:ResourceTag/${TagKey} (Service
            # Authorization Reference, Amazon EKS), so an add-on's or another tool's stays.
            iam.PolicyStatement(sid="RemoveRunIdentity", actions=["eks:DeletePodIdentityAssociation"],
                                resources=[association_arn],
                                conditions={"StringEquals": {f"aws:ResourceTag/{k}": v for k, v in PART_OF.items()}}),
            iam.PolicyStatement(sid="PassRunRole", actions=["iam:PassRole"], resources=[run_role.role_arn],
                                conditions={"StringEquals": {"iam:PassedToService": "pods.eks.amazonaws.com"}}),
            # Abort: a multipart upload of a large input that fails (raytrain_eks/runs/results.py put_once)
            iam.PolicyStatement(sid="UploadCodeAndInputs", actions=["s3:PutObject", "s3:GetObject",
                                                                    "s3:AbortMultipartUpload"], conditions=owned,
                                resources=[f"{bucket_arn}/{code_prefix}/*", f"{bucket_arn}/{prefix}/{INPUTS_PREFIX}/*"]),
            iam.PolicyStatement(sid="ReadRuns", actions=["s3:GetObject"], resources=[f"{bucket_arn}/{prefix}/*"],
                                conditions=owned),
            iam.PolicyStatement(sid="ListRuns", actions=["s3:ListBucket"], resources=[bucket_arn], conditions=owned),
        ])
        for resource, why in (
                (f"arn:<AWS::Partition>:eks:{_nag(stack.region, 'AWS::Region')}:{_nag(stack.account, 'AWS::AccountId')}"
                 f":podidentityassociation/{cluster_name}/*",
                 "A run's association is removed by its id, known only once submit made it; this cluster's only."),
                (f"arn:<AWS::Partition>:s3:::{bucket_name}/{code_prefix}/*",
                 "People who submit upload the content-addressed code archive; this prefix of the one bucket."),
                (f"arn:<AWS::Partition>:s3:::{bucket_name}/{prefix}/{INPUTS_PREFIX}/*",
                 "People who submit upload a job's local inputs, content-addressed, under this one folder."),
                (f"arn:<AWS::Partition>:s3:::{bucket_name}/{prefix}/*",
                 "People who submit read their runs' results back (records, logs, the exported model).")):
            acknowledge(self.policy, f"AwsSolutions-IAM5[Resource::{resource}]", why)
        CfnOutput(stack, "SubmitRunsPolicyArn", value=self.policy.managed_policy_arn,
                  description="Attach to the people who submit (cluster.submitter_principal_arns)")
