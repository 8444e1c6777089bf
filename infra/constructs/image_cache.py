"""The ECR pull-through cache of the public registry, and the node role's right to fill it.

The rule maps ``<account>.dkr.ecr.<region>.amazonaws.com/<prefix>/<name>`` to
``public.ecr.aws/<name>``: the first pull of an image ECR does not hold yet makes ECR create
the repository ``<prefix>/<name>`` and import the image from upstream, from AWS's addresses
(no NAT, no anonymous rate limit on the node's address); later pulls are served from the cache
(Amazon ECR User Guide, "Using pull through cache rules").

The pull is the node's (kubelet and containerd run with the node role): besides the pull
actions of AmazonEC2ContainerRegistryReadOnly it needs ``ecr:BatchImportUpstreamImage`` and,
while the repository does not exist yet, ``ecr:CreateRepository`` (Amazon ECR User Guide, "IAM
permissions required to sync an upstream registry with an Amazon ECR private registry"). Both
act on repositories, so both are granted on ``repository/<prefix>/*`` only: the nodes cannot
create or import anything outside the cache.

What CloudFormation does not own: the repositories the cache creates. ``cdk destroy`` removes
the rule and leaves them (and the cached image's storage) in the account; a redeploy with the
same prefix finds them again.
"""
from __future__ import annotations

from aws_cdk import Stack, aws_ecr as ecr, aws_iam as iam
from constructs import Construct

from environment.image_source import CACHE_UPSTREAM_REGISTRY, CACHE_UPSTREAM_URL
from infra.nag import acknowledge

NODE_CACHE_ACTIONS = ("ecr:BatchImportUpstreamImage", "ecr:CreateRepository")


class PullThroughCache(Construct):
    """Exposes :attr:`rule` (the ``AWS::ECR::PullThroughCacheRule``) and :attr:`policy` (the
    node role's statements, scoped to the rule's prefix)."""

    def __init__(self, scope: Construct, construct_id: str, *, prefix: str, node_role: iam.IRole) -> None:
        super().__init__(scope, construct_id)
        # No credential: ECR Public needs none (a CredentialArn is only for registries that do).
        self.rule = ecr.CfnPullThroughCacheRule(
            self, "Rule", ecr_repository_prefix=prefix,
            upstream_registry_url=CACHE_UPSTREAM_URL, upstream_registry=CACHE_UPSTREAM_REGISTRY)
        repositories = Stack.of(self).format_arn(service="ecr", resource="repository", resource_name=f"{prefix}/*")
        self.policy = iam.Policy(self, "NodePolicy", roles=[node_role], statements=[iam.PolicyStatement(
            actions=list(NODE_CACHE_ACTIONS), resources=[repositories])])
        stack = Stack.of(self)
        finding = f"arn:<AWS::Partition>:ecr:{stack.region}:{stack.account}:repository/{prefix}/*"
        acknowledge(self.policy, f"AwsSolutions-IAM5[Resource::{finding}]",
                    f"The cache creates one repository per upstream image under the prefix {prefix}/ on the "
                    "first pull, so the node role may create and import only there (a pull-through cache "
                    "rule cannot name its repositories in advance).")
