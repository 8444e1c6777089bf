"""`raytrain-eks verify`'s image-cache check: with ``image.pull_through_cache``, a first deploy
of the cluster stack creates the ECR pull-through cache rule ``<cluster>-ecr-public``. A rule is
identified by its prefix (``AWS::ECR::PullThroughCacheRule`` primaryIdentifier
``/properties/EcrRepositoryPrefix``), so one made by hand or left by a failed stack makes the
creation fail ("PullThroughCacheRuleAlreadyExistsException", ECR API Reference,
CreatePullThroughCacheRule) and the whole cluster stack rolls back."""
from __future__ import annotations

from environment import Environment
from environment.image_source import CACHE_UPSTREAM_URL, cache_prefix
from raytrain_eks.verify import Finding, failed, passed
from raytrain_eks.verify_account import stack_exists


def check_image_cache(env: Environment, cloudformation, ecr) -> list[Finding]:
    """Nothing to check with the cache off, or once the cluster stack exists (it owns the rule)."""
    from infra.stack_names import stack_name

    if not env.image.pull_through_cache:
        return []
    prefix = cache_prefix(env.cluster.name)
    if stack_exists(cloudformation, stack_name(env.cluster.name, "cluster")):
        return [passed("image-cache", f"pull-through cache rule {prefix} belongs to the cluster stack")]
    try:
        rules = ecr.describe_pull_through_cache_rules(ecrRepositoryPrefixes=[prefix])["pullThroughCacheRules"]
    except ecr.exceptions.PullThroughCacheRuleNotFoundException:
        rules = []
    if rules:
        upstream = rules[0].get("upstreamRegistryUrl", "?")
        return [failed("image-cache", f"a pull-through cache rule {prefix} (upstream {upstream}) already exists "
                                      "outside the cluster stack, which would fail creating it",
                       f"aws ecr delete-pull-through-cache-rule --ecr-repository-prefix {prefix} "
                       f"--region {env.cluster.region} (the cached repositories stay)")]
    return [passed("image-cache", f"no rule {prefix} in the way; the stack creates it for {CACHE_UPSTREAM_URL}")]
