"""The account-side checks of `raytrain-eks verify` (see :mod:`raytrain_eks.verify.checks`): whose
credentials these are, whether CDK is bootstrapped, whether every admin principal exists, what a
first deploy would collide with (a leftover bucket or log group, an image cache rule), and which
of the spec's GPU node groups already exist.

The image cache: with ``image.pull_through_cache``, a first deploy of the cluster stack creates
the ECR pull-through cache rule ``<cluster>-ecr-public``. A rule is identified by its prefix
(``AWS::ECR::PullThroughCacheRule`` primaryIdentifier ``/properties/EcrRepositoryPrefix``), so one
made by hand or left by a failed stack makes the creation fail
("PullThroughCacheRuleAlreadyExistsException", ECR API Reference, CreatePullThroughCacheRule) and
the whole cluster stack rolls back.

The node groups: which exist, so that the deploy writes a desired size only for a group it
creates (infra/verify_gate.py says why). Read-only: EKS DescribeCluster, ListNodegroups and
DescribeNodegroup on the spec's cluster; no cluster yet means no group exists.

The pipeline's Deploy build records the same (:func:`record_node_groups`, ``python -m
raytrain_eks.pipeline record-groups``), just before ``cdk deploy``: the pipeline deploys with
``-c raytrain:skip-verify=true`` (its gate is its own checks); without a record app.py writes
every autoscaled group's DesiredSize, and that update resets the running GPU nodes to it. It
writes the record where app.py reads it (infra/verify_gate.py), in the Release stage, under its
lock: no other execution creates a group in between."""
from __future__ import annotations

from pathlib import Path

from environment import Environment
from environment.image_source import CACHE_UPSTREAM_URL, cache_prefix
from infra import verify_gate
from infra.verify_gate import autoscaled, creation_key, existing
from raytrain_eks.verify.checks import Finding, failed, passed

CDK_TOOLKIT_STACK = "CDKToolkit"
MIN_BOOTSTRAP_VERSION = 6
"""aws-cdk-lib 2.275 core/lib/stack-synthesizers/default-synthesizer.js MIN_BOOTSTRAP_STACK_VERSION."""
OK_STACK_STATES = ("CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE", "IMPORT_COMPLETE")


def check_account(env: Environment, sts) -> list[Finding]:
    account = sts.get_caller_identity()["Account"]
    if env.cluster.account and env.cluster.account != account:
        return [failed("account", f"the credentials are for account {account}, {env.source} cluster.account is "
                      f"{env.cluster.account}", "use the spec's account's credentials (AWS_PROFILE), or correct cluster.account")]
    return [passed("account", f"credentials for account {account}")]


def check_bootstrap(env: Environment, cloudformation) -> list[Finding]:
    from botocore.exceptions import ClientError

    fix = f"cdk bootstrap aws://{env.cluster.account or '<account>'}/{env.cluster.region}"
    try:
        [stack] = cloudformation.describe_stacks(StackName=CDK_TOOLKIT_STACK)["Stacks"]
    except ClientError as err:
        if "does not exist" not in str(err):
            raise
        return [failed("bootstrap", f"no {CDK_TOOLKIT_STACK} stack in {env.cluster.region}", fix)]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    version = int(outputs.get("BootstrapVersion", "0") or 0)
    if stack["StackStatus"] not in OK_STACK_STATES:
        return [failed("bootstrap", f"{CDK_TOOLKIT_STACK} is {stack['StackStatus']}", fix)]
    if version < MIN_BOOTSTRAP_VERSION:
        return [failed("bootstrap", f"{CDK_TOOLKIT_STACK} is at bootstrap version {version}, "
                      f"this CDK needs {MIN_BOOTSTRAP_VERSION} or later", fix)]
    return [passed("bootstrap", f"{CDK_TOOLKIT_STACK} version {version} in {env.cluster.region}")]


def stack_exists(cloudformation, name: str) -> bool:
    """Whether stack ``name`` exists (and is not deleted) in the client's region."""
    from botocore.exceptions import ClientError

    try:
        stacks = cloudformation.describe_stacks(StackName=name)["Stacks"]
    except ClientError as err:
        if "does not exist" in str(err):
            return False
        raise
    return any(s["StackStatus"] != "DELETE_COMPLETE" for s in stacks)


def denies_non_tls(policy_text: str) -> bool:
    """Whether a bucket policy denies every S3 action over plain HTTP (CDK's ``enforceSSL``
    statement: Deny, s3:*, any principal, ``aws:SecureTransport`` false)."""
    import json

    statements = json.loads(policy_text).get("Statement", [])
    for s in statements if isinstance(statements, list) else [statements]:
        actions = s.get("Action", [])
        condition = s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport")
        if (s.get("Effect") == "Deny" and "s3:*" in ([actions] if isinstance(actions, str) else actions)
                and s.get("Principal") in ("*", {"AWS": "*"}) and str(condition).lower() == "false"):
            return True
    return False


def _adopted_policy(env: Environment, s3) -> list[Finding]:
    """The adopted bucket keeps the policy its first deploy retained (the storage stack cannot
    create another: one policy per bucket); it must still deny non-TLS access."""
    from botocore.exceptions import ClientError

    bucket = env.bucket_name
    try:
        text = s3.get_bucket_policy(Bucket=bucket)["Policy"]
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") != "NoSuchBucketPolicy":
            raise
        text = "{}"
    if denies_non_tls(text):
        return [passed("leftover", f"bucket {bucket}: its kept policy denies non-TLS access")]
    return [failed("leftover", f"bucket {bucket} (storage.existing_bucket = true) has no policy denying non-TLS access",
                   f"put back a statement denying s3:* to any principal when aws:SecureTransport is false "
                   f"(aws s3api put-bucket-policy --bucket {bucket})")]


def check_leftovers(env: Environment, cloudformation, s3, logs) -> list[Finding]:
    """What a first deploy (or one after ``cdk destroy``) would collide with: a create fails on a
    name that already exists, and the stack rolls back."""
    from botocore.exceptions import ClientError

    from environment.contract import control_plane_log_group, stack_name

    out = []
    bucket = env.bucket_name
    if not stack_exists(cloudformation, stack_name(env.cluster.name, "storage")):
        try:
            s3.head_bucket(Bucket=bucket)
            exists = True
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
                raise
            exists = False
        if exists and not env.storage.existing_bucket:
            out.append(failed("leftover", f"bucket {bucket} already exists (kept by an earlier deploy?)",
                             f"set storage.existing_bucket = true in {env.source} to adopt it"))
        elif not exists and env.storage.existing_bucket:
            out.append(failed("leftover", f"storage.existing_bucket = true but bucket {bucket} does not exist",
                             f"set storage.existing_bucket = false in {env.source}"))
        else:
            out.append(passed("leftover", f"bucket {bucket}: {'adopted' if exists else 'created'} by the storage stack"))
            if exists:
                out += _adopted_policy(env, s3)
    if not env.cluster.existing and not stack_exists(cloudformation, stack_name(env.cluster.name, "cluster")):
        # (on an existing cluster the stack creates no control-plane log group: EKS's is the owner's)
        group = control_plane_log_group(env.cluster.name)
        found = logs.describe_log_groups(logGroupNamePrefix=group).get("logGroups", [])
        if any(g["logGroupName"] == group for g in found):
            out.append(failed("leftover", f"log group {group} already exists (the cluster stack creates it)",
                             f"aws logs delete-log-group --log-group-name {group} --region {env.cluster.region}"))
        else:
            out.append(passed("leftover", f"no log group {group} in the way"))
    return out


def check_admins(env: Environment, iam, sts) -> list[Finding]:
    """Every ``cluster.admin_principal_arns`` entry of the deploying account exists (IAM GetRole
    / GetUser): EKS resolves the principal at CreateAccessEntry, and a mistyped ARN fails the
    cluster stack after the control plane is up, rolling it all back. A principal of another
    account (EKS accepts one) cannot be looked up with these credentials: it is said, not failed."""
    from botocore.exceptions import ClientError

    out = []
    here = sts.get_caller_identity()["Account"]
    for arn in env.cluster.admin_principal_arns:
        owner = arn.split(":", 5)[4]
        if owner != here:
            out.append(passed("admins", f"{arn}: not checked here (account {owner}; these credentials are for {here})"))
            continue
        kind, _, path_name = arn.split(":", 5)[5].partition("/")
        name = path_name.rsplit("/", 1)[-1]  # GetRole/GetUser take the name without its path
        try:
            iam.get_role(RoleName=name) if kind == "role" else iam.get_user(UserName=name)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") != "NoSuchEntity":
                raise
            out.append(failed("admins", f"{arn}: no such IAM {kind} in this account",
                              f"correct cluster.admin_principal_arns in {env.source} (aws iam get-{kind} --{kind}-name {name})"))
            continue
        out.append(passed("admins", f"{arn} exists"))
    return out


def check_tracking_server(env: Environment, sagemaker) -> list[Finding]:
    """``ray.mlflow_tracking_server_arn``: in this account and region (the pods' roles are this
    account's, and a SageMaker MLflow tracking server has no resource policy that could admit
    another account's), existing, and active (DescribeMlflowTrackingServer ``IsActive``): else every
    MLflow call of every run fails and the runs go on untracked, each with one warning."""
    from botocore.exceptions import ClientError

    arn = env.ray.mlflow_tracking_server_arn
    if not arn:
        return []
    region, account, name = arn.split(":")[3], arn.split(":")[4], arn.rsplit("/", 1)[-1]
    fix = f"correct ray.mlflow_tracking_server_arn in {env.source}, or create the server"
    if region != env.cluster.region or (env.cluster.account and account != env.cluster.account):
        return [failed("mlflow", f"{arn} is in {account}/{region}, the cluster in "
                       f"{env.cluster.account or 'this account'}/{env.cluster.region}: its pods cannot reach it", fix)]
    try:
        server = sagemaker.describe_mlflow_tracking_server(TrackingServerName=name)
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        if code not in ("ResourceNotFound", "ValidationException"):
            raise
        return [failed("mlflow", f"{arn}: no such tracking server ({code})", fix)]
    if server.get("IsActive") != "Active":
        return [failed("mlflow", f"{arn} is {server.get('TrackingServerStatus')} ({server.get('IsActive')}): "
                       "the runs' MLflow calls would fail", f"aws sagemaker start-mlflow-tracking-server "
                       f"--tracking-server-name {name}")]
    return [passed("mlflow", f"{arn} is active ({server.get('TrackingServerStatus')}); the pods' roles may call it")]


def check_image_cache(env: Environment, cloudformation, ecr) -> list[Finding]:
    """Nothing to check with the cache off, or once the cluster stack exists (it owns the rule)."""
    from environment.contract import stack_name

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


def node_group_tags(eks, cluster: str) -> list[dict[str, str]]:
    """The tags of every node group of ``cluster`` ([] when the cluster does not exist)."""
    try:
        eks.describe_cluster(name=cluster)
    except eks.exceptions.ResourceNotFoundException:
        return []
    names: list[str] = []
    page = eks.list_nodegroups(clusterName=cluster)
    while True:
        names += page["nodegroups"]
        if not page.get("nextToken"):
            break
        page = eks.list_nodegroups(clusterName=cluster, nextToken=page["nextToken"])
    return [eks.describe_nodegroup(clusterName=cluster, nodegroupName=n)["nodegroup"].get("tags") or {}
            for n in names]


def check_node_groups(env: Environment, eks, found: set[str]) -> list[Finding]:
    """One line per GPU group: updated in place (its size left alone) or created at min_nodes.
    Adds the existing groups' names to ``found`` (what the pass records)."""
    found |= existing(env, node_group_tags(eks, env.cluster.eks_name))
    az, zones = env.cluster.gpu_availability_zone, env.cluster.availability_zones
    out = []
    for g in env.gpu_node_groups:
        if g.existing:  # the existing cluster's own group: raytrain_eks/verify/existing.py checks it
            continue
        if g.name in found:
            size = "its running size left to cluster-autoscaler" if autoscaled(g) else f"sized {g.min_nodes}"
            out.append(passed("node-groups", f"group {g.name} exists ({creation_key(g, az, zones)}): a deploy updates it, {size}"))
        else:
            out.append(passed("node-groups", f"group {g.name} ({creation_key(g, az, zones)}) does not exist yet: "
                                             f"a deploy creates it with {g.min_nodes} node(s)"))
    return out


def record_node_groups(env: Environment, root: Path, eks, account: str, cloudformation) -> frozenset[str]:
    """Write the record of ``env``'s existing GPU groups under ``root``, with the cluster stack's state
    they were read at (infra/verify_gate.py stack_state); returns them."""
    from environment.contract import stack_name

    # the stack's state first: a deploy between the two reads leaves a stale record (refused)
    cluster_stack = verify_gate.stack_state(cloudformation, stack_name(env.cluster.name, "cluster"))
    found = existing(env, node_group_tags(eks, env.cluster.eks_name))
    path = verify_gate.stamp_path(root, env)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(verify_gate.stamp(env, account, verify_gate.now(), found, cluster_stack))
    return found
