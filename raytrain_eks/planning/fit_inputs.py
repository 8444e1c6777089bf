"""What the scheduling-fit check places, read from the synthesized outputs (never retyped):

- node groups: the CDK cluster stack's template in ``cdk.out`` (``AWS::EKS::Nodegroup`` with
  its labels, taints, maximum size, disk, and its launch template's instance type and NVMe
  RAID0 user data); on ``cluster.existing``, the groups it already has, as the spec says;
- Ray pods: the manifests in ``dist/`` (RayCluster heads and workers, each RayJob's own
  cluster and its submitter: the manifest's ``submitterPodTemplate``, else KubeRay's default);
- add-on pods: the add-on table (:mod:`environment.addons`), placed by the add-on's own values.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from environment import Environment
from environment.addons import ADDONS, EKS_ADDON_PODS, AddonPod
from environment.contract import NODE_GROUP_LABEL
from environment.instances import INSTANCE_TYPES
from raytrain_eks.planning.fit import GIB, NodeGroup, Placement, Pod, place

# KubeRay v1.7.0 defaults (common/job.go, common/pod.go) for what a manifest leaves unset.
DEFAULT_SUBMITTER_REQUESTS = {"cpu": "500m", "memory": "200Mi"}
DEFAULT_AUTOSCALER_REQUESTS = {"cpu": "500m", "memory": "512Mi"}
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
EKS_TAINT_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
_UNITS = {"Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def quantity(value: Any, resource: str) -> float:
    """A Kubernetes quantity as a number: cores for cpu, bytes for memory, units otherwise."""
    text = str(value)
    if resource == "cpu" and text.endswith("m"):
        return float(text[:-1]) / 1000
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text)
    if not match:
        raise ValueError(f"not a quantity: {value!r}")
    return float(match.group(1)) * _UNITS.get(match.group(2), 1)


def _requests(resources: dict) -> dict[str, float]:
    # A container with limits only gets requests equal to its limits.
    source = {**resources.get("limits", {}), **resources.get("requests", {})}
    return {k: quantity(v, k) for k, v in source.items()
            if k in ("cpu", "memory") or k.startswith(("nvidia.com/", "vpc.amazonaws.com/"))}


def _affinity_in(affinity: dict | None) -> tuple:
    terms = (((affinity or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    return tuple((e["key"], tuple(e["values"])) for t in terms[:1] for e in t.get("matchExpressions", [])
                 if e.get("operator") == "In")


def pod_from_spec(name: str, spec: dict, image_gib: float, extra: list[dict] = (), wave: int = 2) -> Pod:
    """One pod from a pod template's spec (plus ``extra`` containers KubeRay adds)."""
    total: dict[str, float] = {}
    containers = list(spec.get("containers", [])) + list(extra)
    for container in containers:
        for k, v in _requests(container.get("resources", {})).items():
            total[k] = total.get(k, 0.0) + v
    image = containers[0].get("image", "") if containers else ""
    return Pod(name=name, requests=total, node_selector=dict(spec.get("nodeSelector") or {}),
               affinity_in=_affinity_in(spec.get("affinity")), tolerations=tuple(spec.get("tolerations") or ()),
               image=image, image_gib=image_gib if image else 0.0, wave=wave)


def ray_cluster_pods(name: str, spec: dict, image_gib: float, *, workers_at_max: bool = False,
                     wave: int = 2) -> list[Pod]:
    head = spec["headGroupSpec"]["template"]["spec"]
    extra = []
    if spec.get("enableInTreeAutoscaling"):
        resources = (spec.get("autoscalerOptions") or {}).get("resources") or {"requests": DEFAULT_AUTOSCALER_REQUESTS}
        extra.append({"name": "autoscaler", "resources": resources})
    pods = [pod_from_spec(f"{name}-head", head, image_gib, extra, wave=wave)]
    for group in spec.get("workerGroupSpecs", []):
        count = group.get("maxReplicas", 0) if workers_at_max else group.get("replicas", 0)
        pods += [pod_from_spec(f"{name}-{group['groupName']}-worker-{i}", group["template"]["spec"], image_gib,
                               wave=wave) for i in range(count)]
    return pods


def submitter_pod(job: dict, image_gib: float) -> Pod:
    name = f"{job['metadata']['name']}-submitter"
    template = (job["spec"].get("submitterPodTemplate") or {}).get("spec")
    if template:
        return pod_from_spec(name, template, image_gib)
    # KubeRay's default: the head's image, 500m / 200Mi, no selector, no tolerations.
    cluster = job["spec"].get("rayClusterSpec")
    image = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] if cluster else "ray-head-image"
    return Pod(name=name, requests={k: quantity(v, k) for k, v in DEFAULT_SUBMITTER_REQUESTS.items()},
               image=image, image_gib=image_gib, wave=2)


def rayjob_pods(job: dict, image_gib: float) -> list[Pod]:
    pods = [submitter_pod(job, image_gib)]
    cluster = job["spec"].get("rayClusterSpec")
    if cluster:
        pods += ray_cluster_pods(job["metadata"]["name"], cluster, image_gib)
    return pods


def addon_pods(env: Environment) -> list[Pod]:
    """Every add-on workload, placed by its own values."""
    out: list[Pod] = []

    def add(workload: AddonPod, values: dict) -> None:
        requests = {k: quantity(v, k) for k, v in workload.requests().items()}
        for i in range(1 if workload.kind == "DaemonSet" else workload.replicas):
            suffix = "" if workload.kind == "DaemonSet" or workload.replicas == 1 else f"-{i}"
            out.append(Pod(name=workload.name + suffix, requests=requests,
                           node_selector=dict(values.get("nodeSelector") or {}),
                           affinity_in=_affinity_in(values.get("affinity")),
                           tolerations=tuple(values.get("tolerations") or ()),
                           daemonset=workload.kind == "DaemonSet", wave=0))

    for workload, placement in EKS_ADDON_PODS:
        add(workload, placement)
    for addon in ADDONS:
        if addon.enabled(env):
            values = addon.values(env)
            for workload in addon.pods:
                add(workload, values if workload.placement is None else workload.placement)
    return out


def node_groups(template: dict) -> list[NodeGroup]:
    """The managed node groups of a synthesized cluster stack."""
    resources = template["Resources"]
    groups = []
    for logical_id, resource in resources.items():
        if resource["Type"] != "AWS::EKS::Nodegroup":
            continue
        props = resource["Properties"]
        lt_data: dict = {}
        lt_ref = (props.get("LaunchTemplate") or {}).get("Id")
        if isinstance(lt_ref, dict) and "Ref" in lt_ref:
            lt_data = resources[lt_ref["Ref"]]["Properties"]["LaunchTemplateData"]
        instance_type = (props.get("InstanceTypes") or [lt_data.get("InstanceType")])[0]
        disk = props.get("DiskSize")
        for mapping in lt_data.get("BlockDeviceMappings", []):
            disk = mapping.get("Ebs", {}).get("VolumeSize", disk)
        disk = float(disk or 20)  # EKS's default disk size
        if "RAID0" in json.dumps(lt_data.get("UserData", "")):
            # nodeadm moves containerd's and the kubelet's state onto the NVMe RAID0.
            disk = INSTANCE_TYPES[instance_type].instance_store_gb * 1e9 / GIB
        # The kubelet's well-known labels, which pods may select on too.
        labels = {INSTANCE_TYPE_LABEL: instance_type, **dict(props.get("Labels") or {})}
        taints = tuple((t["Key"], t.get("Value", ""), EKS_TAINT_EFFECTS[t["Effect"]]) for t in props.get("Taints", []))
        groups.append(NodeGroup(name=labels.get(NODE_GROUP_LABEL, logical_id), instance_type=instance_type,
                                nodes=int(props["ScalingConfig"]["MaxSize"]), labels=labels, taints=taints,
                                image_disk_gib=disk))
    return groups


def existing_node_groups(env: Environment) -> list[NodeGroup]:
    """The groups an existing cluster already has (``cluster.existing``), which no template of
    this app holds: as the spec describes them (verify checks them against the cluster)."""
    system = env.system_node_group
    out = []
    if system.existing:
        out.append(NodeGroup(name="system", instance_type=system.instance_type, nodes=system.nodes,
                             labels={INSTANCE_TYPE_LABEL: system.instance_type, **system.labels},
                             image_disk_gib=float(system.disk_gib)))
    for g in env.gpu_node_groups:
        if g.existing:
            out.append(NodeGroup(name=g.name, instance_type=g.instance_type, nodes=g.max_nodes,
                                 labels={INSTANCE_TYPE_LABEL: g.instance_type, **g.labels},
                                 taints=tuple((t["key"], t["value"], t["effect"]) for t in g.taints),
                                 image_disk_gib=float(g.root_volume_gib)))
    return out


def read_manifests(dist: Path) -> tuple[dict | None, list[dict]]:
    """(the RayCluster, the RayJobs) of a synthesized ``dist/``."""
    cluster, jobs = None, []
    for path in sorted(Path(dist).glob("*.k8s.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc and doc.get("kind") == "RayCluster":
                cluster = doc
            elif doc and doc.get("kind") == "RayJob":
                jobs.append(doc)
    return cluster, jobs


def cluster_template(env: Environment, cdk_out: Path) -> dict:
    path = Path(cdk_out) / f"{env.cluster.name}-cluster.template.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no synthesized cluster stack (run `cdk synth` first)")
    return json.loads(path.read_text(encoding="utf-8"))


def fit_cases(env: Environment, template: dict, dist: Path, *, together: str = "smoke") -> list[Placement]:
    """Every case: the long-lived cluster; each RayJob alone; the long-lived cluster with each
    ``-on-cluster`` job (its workers at maxReplicas); the long-lived cluster plus ``together``."""
    groups = node_groups(template) + existing_node_groups(env)
    addons = addon_pods(env)
    image_gib = float(env.image.disk_gib)
    cluster, jobs = read_manifests(dist)
    if cluster is None:
        raise FileNotFoundError(f"{dist}: no RayCluster manifest (run `cdk8s synth` first)")
    long_lived = ray_cluster_pods(cluster["metadata"]["name"], cluster["spec"], image_gib, wave=1)
    cases = [place("long-lived RayCluster", groups, addons + long_lived)]
    for job in jobs:
        name = job["metadata"]["name"]
        if job["spec"].get("rayClusterSpec"):
            cases.append(place(f"RayJob {name} alone", groups, addons + rayjob_pods(job, image_gib)))
            if name == together:
                cases.append(place(f"long-lived RayCluster + RayJob {name}", groups,
                                   addons + long_lived + rayjob_pods(job, image_gib)))
        else:
            scaled = ray_cluster_pods(cluster["metadata"]["name"], cluster["spec"], image_gib, workers_at_max=True,
                                      wave=1)
            cases.append(place(f"long-lived RayCluster + RayJob {name}", groups,
                               addons + scaled + [submitter_pod(job, image_gib)]))
    return cases
