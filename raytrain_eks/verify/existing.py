"""The checks `raytrain-eks verify` runs for ``cluster.existing`` (environment/existing.py): the
existing cluster against the spec, and one line per thing a deploy would install.

- the cluster (EKS DescribeCluster): ACTIVE, the spec's Kubernetes version, VPC, cluster
  security group and endpoint access, and an authentication mode that takes access entries
  (the kubectl handler gets one); the private subnets are the VPC's, one per spec AZ (EC2
  DescribeSubnets);
- its EKS add-ons (ListAddons, DescribeAddon): the Pod Identity agent (the Ray and
  cluster-autoscaler roles come through it), the VPC CNI with network-policy enforcement (the
  Ray namespace's policies are otherwise not enforced);
- its node groups (DescribeNodegroup, and the nodes through kubectl): the system group and every
  existing GPU group carry the spec's labels and taint, the GPU type and at least ``max_nodes``;
  running GPU nodes offer the GPUs and EFA devices the spec counts;
- every row of the add-on table (raytrain_eks/verify/cluster_inventory.py): present where the spec
  says so (KubeRay at the spec's version, in the namespace the Ray network policy admits),
  absent where the spec installs it (a deploy would otherwise take over or collide with it);
- the Ray namespace does not exist yet (the stack creates it; it never adopts one);
- then ``install`` lines: what a deploy adds.
"""
from __future__ import annotations

import json

from environment import Environment
from environment.addons import ADDONS, ADDONS_BY_KEY, NODE_MONITORING_AGENT, installed_addons, node_monitoring_configuration
from environment.contract import EFA_RESOURCE, GPU_RESOURCE, GPU_TAINT_KEY, PART_OF
from raytrain_eks.verify.cluster_inventory import Inventory, find_addon
from raytrain_eks.verify.checks import Finding, failed, passed

ACCESS_ENTRY_MODES = ("API", "API_AND_CONFIG_MAP")
"""EKS authentication modes that take access entries (EKS API Reference, CreateAccessConfigRequest)."""
POD_IDENTITY_AGENT = "eks-pod-identity-agent"


def _endpoint(config: dict) -> str:
    public, private = config.get("endpointPublicAccess"), config.get("endpointPrivateAccess")
    return "public_and_private" if public and private else "private" if private else "public"


def check_cluster(env: Environment, eks, ec2) -> list[Finding]:
    c, src = env.cluster, env.source
    try:
        cluster = eks.describe_cluster(name=c.existing)["cluster"]
    except eks.exceptions.ResourceNotFoundException:
        return [failed("cluster", f"no EKS cluster {c.existing!r} in {c.region}",
                       f"correct cluster.existing (or cluster.region) in {src} (aws eks list-clusters --region {c.region})")]
    config = cluster.get("resourcesVpcConfig") or {}
    wrong = []
    if cluster.get("status") != "ACTIVE":
        wrong.append((f"its status is {cluster.get('status')}", "wait until it is ACTIVE"))
    if cluster.get("version") != c.kubernetes_version:
        wrong.append((f"it runs Kubernetes {cluster.get('version')}, the spec says {c.kubernetes_version}",
                      f"set cluster.kubernetes_version = \"{cluster.get('version')}\" (the kubectl layer follows it)"))
    for field, want, got in (("vpc_id", c.vpc_id, config.get("vpcId")),
                             ("cluster_security_group_id", c.cluster_security_group_id, config.get("clusterSecurityGroupId"))):
        if want != got:
            wrong.append((f"its {field} is {got}, the spec says {want}", f"set cluster.{field} = \"{got}\""))
    if _endpoint(config) != c.endpoint_access:
        wrong.append((f"its endpoint is {_endpoint(config)}, the spec says {c.endpoint_access}",
                      f"set cluster.endpoint_access = \"{_endpoint(config)}\" (it places the kubectl handler)"))
    elif c.endpoint_access != "private" and sorted(config.get("publicAccessCidrs") or []) != sorted(c.public_access_cidrs):
        wrong.append((f"its public endpoint admits {config.get('publicAccessCidrs')}, the spec lists "
                      f"{list(c.public_access_cidrs)}", "copy them into cluster.public_access_cidrs"))
    mode = (cluster.get("accessConfig") or {}).get("authenticationMode", "CONFIG_MAP")
    if mode not in ACCESS_ENTRY_MODES:
        wrong.append((f"its authentication mode is {mode}: no access entry can admit the kubectl handler",
                      f"aws eks update-cluster-config --name {c.existing} --access-config authenticationMode=API_AND_CONFIG_MAP"))
    out = [failed("cluster", f"{c.existing}: {what}", f"{fix} in {src}" if fix.startswith("set") else fix)
           for what, fix in wrong]
    out += _subnets(env, ec2)
    if not out:
        out.append(passed("cluster", f"{c.existing}: ACTIVE, Kubernetes {c.kubernetes_version}, VPC {c.vpc_id}, "
                                     f"endpoint {c.endpoint_access}, authentication {mode}"))
    return out


def _subnets(env: Environment, ec2) -> list[Finding]:
    c = env.cluster
    found = {s["SubnetId"]: s for s in ec2.describe_subnets(SubnetIds=list(c.private_subnet_ids))["Subnets"]}
    out = []
    for i, (subnet, az) in enumerate(zip(c.private_subnet_ids, c.availability_zones)):
        s = found.get(subnet, {})
        if s.get("VpcId") != c.vpc_id or s.get("AvailabilityZone") != az:
            out.append(failed("cluster", f"private_subnet_ids[{i}] {subnet} is in {s.get('VpcId')} / {s.get('AvailabilityZone')}, "
                                         f"not {c.vpc_id} / {az}",
                              f"list one private subnet of {c.vpc_id} per AZ, in cluster.availability_zones' order, in {env.source}"))
    return out


def check_cluster_addons(env: Environment, eks) -> list[Finding]:
    name = env.cluster.existing
    present = eks.list_addons(clusterName=name).get("addons", [])
    out = []
    if POD_IDENTITY_AGENT not in present:
        out.append(failed("cluster-addons", f"{name} has no {POD_IDENTITY_AGENT} add-on: the Ray pods' role comes through Pod Identity",
                          f"aws eks create-addon --cluster-name {name} --addon-name {POD_IDENTITY_AGENT}"))
    if env.gpu_node_groups and NODE_MONITORING_AGENT not in present:
        out.append(failed("cluster-addons", f"{name} has no {NODE_MONITORING_AGENT} add-on: a GPU node that goes bad "
                                            "(an XID 79) is never marked unhealthy, so node auto repair never replaces it",
                          f"aws eks create-addon --cluster-name {name} --addon-name {NODE_MONITORING_AGENT} "
                          f"--configuration-values '{json.dumps(node_monitoring_configuration())}'"))
    for addon in present:
        described = eks.describe_addon(clusterName=name, addonName=addon)["addon"]
        version = described.get("addonVersion", "")
        if addon == NODE_MONITORING_AGENT and env.gpu_node_groups:
            config = json.loads(described.get("configurationValues") or "{}")
            blind = [part for part in ("nodeAgent", "dcgmAgent")
                     if not any(t.get("key") == GPU_TAINT_KEY and t.get("operator") == "Exists" or t == {"operator": "Exists"}
                                for t in (config.get(part) or {}).get("tolerations") or [])]
            if blind:
                out.append(failed("cluster-addons", f"{addon} {version}: {' and '.join(blind)} do not tolerate the GPU taint "
                                                    f"{GPU_TAINT_KEY}: it never runs on the GPU nodes it should watch",
                                  f"aws eks update-addon --cluster-name {name} --addon-name {addon} "
                                  f"--configuration-values '{json.dumps(node_monitoring_configuration())}'"))
                continue
        if addon == "vpc-cni":
            config = json.loads(described.get("configurationValues") or "{}")
            if str(config.get("enableNetworkPolicy", "false")).lower() != "true":
                out.append(failed("cluster-addons", f"vpc-cni {version} does not enforce NetworkPolicies: the Ray namespace's "
                                               "default-deny would be ignored",
                                  f"aws eks update-addon --cluster-name {name} --addon-name vpc-cni "
                                  "--configuration-values '{\"enableNetworkPolicy\":\"true\"}'"))
                continue
        out.append(passed("cluster-addons", f"{addon} {version} (EKS add-on of {name})"))
    return out


def _group_problems(env: Environment, eks, inventory: Inventory, nodegroup: str, labels: dict, taints: tuple,
                    instance_type: str = "", max_nodes: int = 0, gpus: int = 0, efa: int = 0, repair: bool = False) -> list[str]:
    try:
        group = eks.describe_nodegroup(clusterName=env.cluster.existing, nodegroupName=nodegroup)["nodegroup"]
    except eks.exceptions.ResourceNotFoundException:
        return [f"no node group {nodegroup!r} in {env.cluster.existing}"]
    wrong = []
    missing = {k: v for k, v in labels.items() if (group.get("labels") or {}).get(k) != v}
    if missing:
        wrong.append(f"labels {missing} missing (aws eks update-nodegroup-config --labels addOrUpdateLabels=...)")
    have = {(t.get("key"), t.get("value"), t.get("effect")) for t in group.get("taints") or []}
    for t in taints:
        if (t["key"], t["value"], "NO_SCHEDULE" if t["effect"] == "NoSchedule" else t["effect"]) not in have:
            wrong.append(f"taint {t['key']}={t['value']}:{t['effect']} missing")
    if instance_type and instance_type not in (group.get("instanceTypes") or []):
        wrong.append(f"its instance types are {group.get('instanceTypes')}, the spec says {instance_type}")
    if repair and (group.get("nodeRepairConfig") or {}).get("enabled") is not True:
        # a GPU node the monitoring agent marks unhealthy stays in the group, and the next attempt lands on it
        wrong.append("node auto repair is off (aws eks update-nodegroup-config --node-repair-config enabled=true)")
    if max_nodes and (group.get("scalingConfig") or {}).get("maxSize", 0) < max_nodes:
        wrong.append(f"its maxSize {(group.get('scalingConfig') or {}).get('maxSize')} is below max_nodes {max_nodes}")
    for node in inventory.nodes_of(nodegroup):
        node_labels = node["metadata"].get("labels") or {}
        if any(node_labels.get(k) != v for k, v in labels.items()):
            wrong.append(f"node {node['metadata']['name']} lacks the labels {labels}")
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        for resource, want in ((GPU_RESOURCE, gpus), (EFA_RESOURCE, efa)):
            if want and int(allocatable.get(resource, "0")) != want:
                wrong.append(f"node {node['metadata']['name']} offers {resource}={allocatable.get(resource, 0)}, the spec "
                             f"counts {want} (is its device plugin running?)")
    return wrong


def check_node_groups(env: Environment, eks, inventory: Inventory) -> list[Finding]:
    system = env.system_node_group
    cases = [("system", system.existing, system.labels, (), {})]
    cases += [(g.name, g.existing, g.labels, g.taints, dict(instance_type=g.instance_type, max_nodes=g.max_nodes,
                                                           gpus=g.gpus_per_node, efa=g.efa_per_node, repair=True))
              for g in env.gpu_node_groups if g.existing]
    out = []
    for name, nodegroup, labels, taints, sizes in cases:
        wrong = _group_problems(env, eks, inventory, nodegroup, labels, taints, **sizes)
        running = len(inventory.nodes_of(nodegroup))
        if wrong:
            out.append(failed("existing-groups", f"{name} ({nodegroup}): " + "; ".join(wrong),
                              f"fix node group {nodegroup} of {env.cluster.existing}, or the spec's entry in {env.source}"))
        else:
            out.append(passed("existing-groups", f"{name} ({nodegroup}): labels and taints as the spec's, {running} node(s) running"))
    return out


def check_addons(env: Environment, inventory: Inventory) -> list[Finding]:
    present, out = env.cluster.present_addons, []
    for addon in ADDONS:
        if not addon.enabled(env) and addon.key not in present:
            continue
        version = env.versions.chart(addon.key)
        found = find_addon(inventory, addon, version)
        if addon.key in present and found is None:
            out.append(failed("addons", f"{addon.key}: cluster.present_addons names it, the cluster does not run {addon.chart}",
                              f"remove {addon.key!r} from cluster.present_addons in {env.source} (a deploy then installs it)"))
        elif addon.key not in present and found is not None:
            out.append(failed("addons", f"{addon.key}: the cluster runs it ({found.describe()}): a deploy would take over "
                                        "or collide with it, and a destroy remove it",
                              f"add {addon.key!r} to cluster.present_addons in {env.source}"))
        elif found is not None and addon.key == "kuberay_operator":
            out += _kuberay(env, found, version)
        elif found is not None and addon.key == "kueue":
            out += _kueue(env, found, inventory)
        elif found is not None:
            out.append(passed("addons", f"{addon.key}: present ({found.describe()}), not installed"))
    return out


def _kuberay(env: Environment, found, version: str) -> list[Finding]:
    """The RayJobs are written and validated for the pinned KubeRay; the Ray namespace's network
    policy admits the operator from the table's namespace only (environment/network_policy.py)."""
    out = []
    namespace = ADDONS_BY_KEY["kuberay_operator"].namespace
    if found.version and found.version.lstrip("v") != version.lstrip("v"):
        out.append(failed("addons", f"kuberay_operator: the cluster runs KubeRay {found.version} ({found.describe()}), the "
                                    f"RayJobs are written for {version}",
                          f"upgrade it to {version}, or set versions.kuberay_operator in {env.source} to a version whose CRDs are pinned"))
    elif not found.version:
        out.append(failed("addons", f"kuberay_operator: {found.describe()}: its version cannot be read",
                          f"install KubeRay {version} with its Helm chart (or remove it from cluster.present_addons)"))
    if found.namespace and found.namespace != namespace:
        out.append(failed("addons", f"kuberay_operator runs in namespace {found.namespace}: the Ray namespace admits "
                                    f"the operator from {namespace} only",
                          f"run the operator in {namespace}, or let this app install it"))
    return out or [passed("addons", f"kuberay_operator: KubeRay {found.version} present ({found.describe()}), not installed")]


def _kueue(env: Environment, found, inventory: Inventory) -> list[Finding]:
    """A team's own Kueue takes this app's queue objects (environment/queueing.py) and suspends
    and admits its RayJobs only if it manages RayJobs (``integrations.frameworks`` of its
    configuration API, config.kueue.x-k8s.io, lists the job frameworks it sets up: this app's
    own install lists ``ray.io/rayjob`` and ``ray.io/raycluster``, environment/queueing.py
    ``KUEUE_FRAMEWORKS``) and serves the
    objects' API version (their CRDs' ``spec.versions[].served``)."""
    import yaml

    from environment.queueing import KUEUE_API, KUEUE_FRAMEWORKS, KUEUE_RESOURCES, kueue_objects

    out, where, config = [], found.namespace or "kueue-system", None
    text = inventory.manager_configs.get(where)
    if text is None:
        out.append(failed("addons", f"kueue: {found.describe()}: no manager configuration (ConfigMap with "
                                    f"controller_manager_config.yaml) in {where} to confirm it manages RayJobs",
                          f"let kubectl read ConfigMaps in {where}, or set queueing.enabled = false in {env.source}"))
    else:
        try:
            config = yaml.safe_load(text) or {}
        except yaml.YAMLError:
            config = None
        frameworks = ((config or {}).get("integrations") or {}).get("frameworks") if isinstance(config, dict) else None
        missing = [f for f in KUEUE_FRAMEWORKS if not isinstance(frameworks, list) or f not in frameworks]
        if missing:
            out.append(failed("addons", f"kueue: {found.describe()} does not manage {', '.join(missing)} "
                                        f"(integrations.frameworks: {frameworks!r}): "
                                        f"{'; '.join(KUEUE_FRAMEWORKS[f] for f in missing)}",
                              f"add {', '.join(missing)} to integrations.frameworks of its manager config in {where}, "
                              f"or set queueing.enabled = false in {env.source}"))
        if isinstance(config, dict):
            out += _kueue_manages_unlabelled(env, config, inventory, where)
    out += _kueue_version(env, found, inventory, where, config if isinstance(config, dict) else None)
    version = KUEUE_API.rsplit("/", 1)[1]
    kinds = sorted({(o["kind"], o["apiVersion"]) for o in kueue_objects(env)})
    for kind, _ in kinds:
        crd = f"{KUEUE_RESOURCES[kind]}.{KUEUE_API.split('/')[0]}"
        if version not in inventory.served.get(crd, ()):
            served = sorted(inventory.served.get(crd, ()))
            out.append(failed("addons", f"kueue: {found.describe()} serves {kind} at {served or 'no version'}, "
                                        f"the queue objects are {KUEUE_API}",
                              f"upgrade Kueue to {env.versions.chart('kueue')} (or one serving {KUEUE_API})"))
    return out or [passed("addons", f"kueue: present ({found.describe()}), manages {', '.join(KUEUE_FRAMEWORKS)} "
                                    f"and serves {KUEUE_API}, not installed")]


KUEUE_MINIMUM = (0, 19, 1)
"""The oldest Kueue the long-lived RayCluster's elastic scheduling works with. Kueue's
``pkg/features/kube_features.go``: ``ElasticJobsViaWorkloadSlices`` is alpha and off from v0.13,
beta and on from v0.18 (v0.15-v0.17 serve v1beta2 too, and their RayCluster webhook refuses an
autoscaling queue-labelled cluster without the gate: ``raycluster_webhook.go`` v0.17.0 :139-145);
v0.18.x and v0.19.0 lack the ungater's fixes (kueue commits cbacfe0850, d01f14fa3b, 3f5a9d5fcd:
scale-up pods stay scheduling-gated for ever)."""
KUEUE_ELASTIC_GATE = "ElasticJobsViaWorkloadSlices"


def _version_tuple(text: str) -> tuple[int, ...] | None:
    parts = text.strip().lstrip("v").split("-")[0].split(".")
    return tuple(int(p) for p in parts[:3]) if len(parts) >= 2 and all(p.isdigit() for p in parts[:3]) else None


def _kueue_manager(inventory: Inventory, where: str) -> dict | None:
    """The manager container of Kueue's controller Deployment (kueue chart v0.19.2
    ``templates/manager/manager.yaml``: container ``manager``, image ``<repository>:<tag or
    appVersion>``, args ``--config=...``, ``--zap-log-level=...`` and ``--feature-gates=A=true,...``)."""
    for workload in inventory.workloads:
        if workload.get("kind", "Deployment") != "Deployment" or workload["metadata"].get("namespace", "") != where:
            continue
        for container in ((workload.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []:
            if container.get("name") == "manager" and "kueue" in container.get("image", ""):
                return container
    return None


def _kueue_version(env: Environment, found, inventory: Inventory, where: str,
                   config: dict | None = None) -> list[Finding]:
    """Kueue's version (its manager's image tag, else its Helm chart's) at least
    :data:`KUEUE_MINIMUM`, and ``ElasticJobsViaWorkloadSlices`` not turned off by ``--feature-gates``
    or, without that flag, by the ``featureGates`` of its manager ``config``."""
    pinned = env.versions.chart("kueue")
    fix = f"upgrade Kueue to {pinned} (the version this app installs), or set queueing.enabled = false in {env.source}"
    minimum = "v" + ".".join(map(str, KUEUE_MINIMUM))
    manager = _kueue_manager(inventory, where)
    image = (manager or {}).get("image", "")
    # "<repository>:<tag>" (chart manager.yaml:60); a digest pin "...:<tag>@sha256:<hex>" keeps the tag
    # before the "@", and a digest-only reference has none: then the Helm release's version
    named = image.split("@", 1)[0].rsplit("/", 1)[-1]
    running = named.rsplit(":", 1)[1] if ":" in named else (found.version or "")
    version = _version_tuple(running)
    if version is None:
        return [failed("addons", f"kueue: {found.describe()}: its version cannot be read (manager image {image or 'not found'} "
                                 f"in {where}); the long-lived RayCluster needs Kueue {minimum} or later", fix)]
    if version < KUEUE_MINIMUM:
        return [failed("addons", f"kueue: the cluster runs Kueue {running} ({found.describe()}): the long-lived "
                                 f"RayCluster needs {minimum} or later ({KUEUE_ELASTIC_GATE} is beta from v0.18, the "
                                 "ungater's fixes arrive in v0.19.1: before, its scale-up pods stay gated)", fix)]
    # The flag, else the manager config's featureGates map (Kueue v0.19.2 cmd/kueue/main.go:161,
    # pkg/config/validation.go:641 LoadAndValidateFeatureGates: the map is read when the flag is empty).
    # Go's flag package takes -name and --name, "=value" or the next argument.
    args, flag = list((manager or {}).get("args") or []), ""
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in ("--feature-gates", "-feature-gates"):
            flag = value if eq else (args[i + 1] if i + 1 < len(args) else "")
    if flag:
        where_set = "--feature-gates"
        items = (item.partition("=") for item in flag.split(","))
        off = any(n.strip() == KUEUE_ELASTIC_GATE and v.strip() in _GO_FALSE for n, _, v in items)
    else:
        where_set = "its manager config's featureGates"
        off = (config or {}).get("featureGates", {}).get(KUEUE_ELASTIC_GATE) is False \
            if isinstance((config or {}).get("featureGates"), dict) else False
    if off:
        return [failed("addons", f"kueue: {found.describe()} runs with {where_set} {KUEUE_ELASTIC_GATE}=false: the "
                                 "long-lived RayCluster's scale-up pods would stay gated",
                       f"remove {KUEUE_ELASTIC_GATE}=false from controllerManager.featureGates of its Helm values "
                       f"(or the featureGates of its manager config) in {where}")]
    return []


_GO_FALSE = frozenset({"0", "f", "F", "false", "FALSE", "False"})
"""What Go's strconv.ParseBool reads as false; k8s.io/component-base featuregate ``Set`` parses
each ``--feature-gates`` value with it (anything else is an error: the manager would not start)."""


def _selector_matches(selector: dict, labels: dict) -> bool:
    """A Kubernetes LabelSelector (matchLabels, matchExpressions) against a namespace's labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and key in labels and labels[key] in values) \
                or (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


def _kueue_manages_unlabelled(env: Environment, config: dict, inventory: Inventory, where: str) -> list[Finding]:
    """``manageJobsWithoutQueueName: true`` suspends every RayJob without a queue label in the
    namespaces ``managedJobsNamespaceSelector`` selects (all, without one): Kueue v0.19.2
    ``pkg/controller/jobframework/utils.go`` ``WorkloadShouldBeSuspended`` :147-156. An
    ``-on-cluster`` RayJob carries no queue label (its cluster is queued); KubeRay v1.7.0 refuses a
    suspended clusterSelector RayJob and Kueue skips clusterSelector jobs: it stays ValidationFailed."""
    if config.get("manageJobsWithoutQueueName") is not True:
        return []
    namespace = env.ray.namespace
    selector = config.get("managedJobsNamespaceSelector")
    # a namespace the cluster stack has yet to create gets at least the name label the API server adds
    labels = ((inventory.namespaces.get(namespace) or {}).get("metadata") or {}).get("labels") or \
        {"kubernetes.io/metadata.name": namespace}
    if isinstance(selector, dict) and not _selector_matches(selector, labels):
        return []
    return [failed("addons", f"kueue: its manager config in {where} sets manageJobsWithoutQueueName: true"
                             f"{' and its managedJobsNamespaceSelector selects' if isinstance(selector, dict) else ' for every namespace, also'}"
                             f" the Ray namespace {namespace}: Kueue would suspend each -on-cluster RayJob (no queue label), "
                             "which KubeRay refuses: it would sit in ValidationFailed",
                   f"give managedJobsNamespaceSelector a selector that leaves out namespace {namespace} (e.g. matchExpressions "
                   f"kubernetes.io/metadata.name NotIn [{namespace}]), or set manageJobsWithoutQueueName: false")]


def _ours(obj: dict) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in PART_OF.items())


def check_queue_names(env: Environment, inventory: Inventory) -> list[Finding]:
    """The queue objects the stack creates (never adopts: environment/queueing.py
    ``kueue_objects``, infra/constructs/cluster_addons.py) against the cluster's own Kueue
    objects: one of the same kind and name (and namespace) not labelled :data:`PART_OF` would
    fail the deploy."""
    from environment.queueing import kueue_objects

    def key(obj: dict) -> tuple:
        meta = obj.get("metadata") or {}
        return obj["kind"], meta.get("namespace", ""), meta["name"]

    theirs = {key(o): o for o in inventory.queue_objects if not _ours(o)}
    q, src, out = env.queueing, env.source, []
    for obj in kueue_objects(env):
        kind, namespace, name = key(obj)
        if (kind, namespace, name) not in theirs:
            continue
        fix = {"LocalQueue": f"set queueing.local_queue in {src} to a name {namespace} does not have",
               "WorkloadPriorityClass": f"rename {name} in queueing.priorities (and where job_priorities or "
                                        f"default_priority name it) in {src}"}.get(
            kind, f"set queueing.name_prefix (e.g. \"raytrain-\") in {src}: the ClusterQueue and ResourceFlavors "
                  f"are named <prefix>{name.removeprefix(q.name_prefix)}")
        out.append(failed("queue-objects", f"{kind} {namespace + '/' if namespace else ''}{name} already exists on "
                                           f"{env.cluster.existing} and is not this app's (no label "
                                           f"{', '.join(f'{k}={v}' for k, v in PART_OF.items())}): the deploy would fail "
                                           "creating it", fix))
    return out or [passed("queue-objects", f"no Kueue object of {env.cluster.existing} has the name of one this app creates")]


def check_namespace(env: Environment, inventory: Inventory) -> list[Finding]:
    ns = env.ray.namespace
    if ns not in inventory.namespaces:
        return [passed("namespace", f"{ns} does not exist yet: the cluster stack creates it")]
    if _ours(inventory.namespaces[ns]):
        return [passed("namespace", f"{ns} exists, made by this app's cluster stack")]
    return [failed("namespace", f"namespace {ns} already exists and is not this app's: the stack would fail to create it",
                   f"set ray.namespace in {env.source} to a namespace the cluster does not have")]


def install_plan(env: Environment) -> list[Finding]:
    """One line per thing a deploy adds to the existing cluster."""
    name, ray = env.cluster.existing, env.ray
    lines = [f"access entry for the kubectl handler's role (AmazonEKSClusterAdminPolicy) on {name}",
             f"namespace {ray.namespace} with its NetworkPolicies and service account {ray.service_account}",
             f"pod role + Pod Identity association {ray.namespace}/{ray.service_account} (bucket {env.bucket_name})"]
    lines += [f"GPU node group {g.name}: {g.min_nodes}-{g.max_nodes} x {g.instance_type} in {env.cluster.gpu_availability_zone}"
              for g in env.gpu_node_groups if not g.existing]
    lines += [f"Helm chart {a.chart} {env.versions.chart(a.key)} into {a.namespace} ({a.key})" for a in installed_addons(env)]
    return [passed("install", line) for line in lines]
