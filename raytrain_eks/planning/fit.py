"""Scheduling fit: would every pod the project creates get a node? (standard library only)

A small model of the Kubernetes scheduler and of an EKS AL2023 node, enough to say which pod
stays Pending and why:

- node allocatable, as nodeadm configures the kubelet on the EKS AL2023 AMI: kube-reserved CPU
  is 6% of the first core, 1% of the second, 0.5% of cores 3-4 and 0.25% of every core above;
  kube-reserved memory is 255 MiB + 11 MiB per pod of the node's max-pods (the ENI formula's
  table, :attr:`environment.instances.InstanceType.max_pods`); the eviction threshold holds
  another 100 MiB back. The kernel keeps part of the nominal memory: 5% is taken off first
  (a 16 GiB instance reports ~15.2 GiB);
- extended resources: GPUs and EFA interfaces per node, the pod limit (max-pods);
- disk: the images of a node's pods against the disk containerd uses (the root volume, or the
  NVMe RAID0 when the node has one), less 15% (the kubelet's image garbage-collection
  threshold) and 4 GiB for the operating system;
- placement: nodeSelector, required node affinity (``In``), taints and tolerations.

DaemonSet pods are placed first, one on every node they may run on; then every other pod in
waves (add-ons, then the long-lived cluster, then a job: what runs already stays), each wave
largest first, on the first node with room (the default scheduler spreads instead of packing,
which can only leave more room, never less, for a pod that fits somewhere). Node groups count at
their maximum size: cluster-autoscaler adds nodes up to it while pods are Pending.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from environment.instances import INSTANCE_TYPES

MIB = 1024 * 1024
GIB = 1024 * MIB
KERNEL_MEMORY_SHARE = 0.05
EVICTION_MEMORY_MIB = 100
IMAGE_GC_HIGH_SHARE = 0.85
OS_DISK_GIB = 4


def kube_reserved_cpu_m(vcpus: int) -> float:
    """Millicores the kubelet reserves on the EKS AMI (6% / 1% / 0.5% / 0.25% per core)."""
    return (60 * min(vcpus, 1) + 10 * min(max(vcpus - 1, 0), 1)
            + 5 * min(max(vcpus - 2, 0), 2) + 2.5 * max(vcpus - 4, 0))


def kube_reserved_memory_mib(max_pods: int) -> int:
    return 255 + 11 * max_pods


def allocatable(instance_type: str) -> dict[str, float]:
    """cpu (cores), memory (bytes), GPUs, EFA interfaces and pods of one node."""
    t = INSTANCE_TYPES[instance_type]
    memory_mib = t.memory_gib * 1024 * (1 - KERNEL_MEMORY_SHARE)
    memory_mib -= kube_reserved_memory_mib(t.max_pods) + EVICTION_MEMORY_MIB
    out = {"cpu": (t.vcpus * 1000 - kube_reserved_cpu_m(t.vcpus)) / 1000, "memory": memory_mib * MIB,
           "pods": float(t.max_pods)}
    if t.gpus:
        out["nvidia.com/gpu"] = float(t.gpus)
    if t.max_efa_interfaces:
        out["vpc.amazonaws.com/efa"] = float(t.max_efa_interfaces)
    return out


@dataclass(frozen=True, kw_only=True)
class NodeGroup:
    name: str
    instance_type: str
    nodes: int
    """Its maximum size (what cluster-autoscaler can scale it to)."""
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[tuple[str, str, str], ...] = ()
    """(key, value, effect) with Kubernetes effects (NoSchedule, ...)."""
    image_disk_gib: float = 20
    """The disk containerd keeps images on (root volume, or the NVMe RAID0)."""

    @property
    def image_room_gib(self) -> float:
        return self.image_disk_gib * IMAGE_GC_HIGH_SHARE - (0 if self.image_disk_gib > 1000 else OS_DISK_GIB)


@dataclass(frozen=True, kw_only=True)
class Pod:
    name: str
    requests: dict[str, float] = field(default_factory=dict)
    """cpu in cores, memory in bytes, extended resources in units."""
    node_selector: dict[str, str] = field(default_factory=dict)
    affinity_in: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Required node affinity: (label, allowed values), all must hold."""
    tolerations: tuple[dict, ...] = ()
    image: str = ""
    image_gib: float = 0.0
    daemonset: bool = False
    wave: int = 0
    """Pods of a lower wave are already running when the next wave arrives (add-ons 0, the
    long-lived cluster 1, a job 2): a job's pods must fit beside them, never displace them."""


def tolerates(pod: Pod, taint: tuple[str, str, str]) -> bool:
    key, value, effect = taint
    for t in pod.tolerations:
        if t.get("effect") and t["effect"] != effect:
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == key):
            return True
        if t.get("key") == key and t.get("operator", "Equal") == "Equal" and t.get("value", "") == value:
            return True
    return False


def mismatch(pod: Pod, group: NodeGroup) -> str | None:
    """Why ``pod`` may never run on ``group``'s nodes (None: it may)."""
    for key, value in pod.node_selector.items():
        if group.labels.get(key) != value:
            return f"nodeSelector {key}={value}"
    for key, values in pod.affinity_in:
        if group.labels.get(key) not in values:
            return f"node affinity {key} in {list(values)}"
    for taint in group.taints:
        if taint[2] in ("NoSchedule", "NoExecute") and not tolerates(pod, taint):
            return f"taint {taint[0]}={taint[1]}:{taint[2]} not tolerated"
    return None


@dataclass
class Node:
    group: NodeGroup
    index: int
    free: dict[str, float]
    images: dict[str, float] = field(default_factory=dict)
    pods: list[str] = field(default_factory=list)
    held: dict[str, dict[str, float]] = field(default_factory=dict)
    """Each placed pod's requests, by pod name: what holds the node's room."""

    @property
    def name(self) -> str:
        return f"{self.group.name}-{self.index}"

    def short(self, pod: Pod) -> str | None:
        """The first resource this node lacks for ``pod`` (None: it fits)."""
        if self.free["pods"] < 1:
            return "pods"
        for resource, amount in pod.requests.items():
            if amount > self.free.get(resource, 0.0) + 1e-9:
                return resource
        if pod.image and pod.image not in self.images:
            if sum(self.images.values()) + pod.image_gib > self.group.image_room_gib:
                return "disk"
        return None

    def place(self, pod: Pod) -> None:
        for resource, amount in pod.requests.items():
            self.free[resource] = self.free.get(resource, 0.0) - amount
        self.free["pods"] -= 1
        if pod.image:
            self.images[pod.image] = pod.image_gib
        self.pods.append(pod.name)
        self.held[pod.name] = dict(pod.requests)


@dataclass
class Placement:
    case: str
    nodes: list[Node]
    pending: list[str] = field(default_factory=list)
    """One line per pod that would stay Pending."""

    @property
    def ok(self) -> bool:
        return not self.pending


def _fmt(resource: str, amount: float) -> str:
    if resource == "memory":
        return f"{amount / GIB:.2f} GiB"
    if resource == "cpu":
        return f"{amount:.3g} CPU"
    if resource == "disk":
        return f"{amount:.0f} GiB of images"
    return f"{amount:g} {resource}"


def _why(pod: Pod, nodes: list[Node]) -> str:
    groups = {n.group.name: n.group for n in nodes}
    allowed = [g for g in groups.values() if mismatch(pod, g) is None]
    if not allowed:
        reasons = "; ".join(f"{g.name}: {mismatch(pod, g)}" for g in groups.values())
        return f"pod {pod.name} stays Pending: no node group accepts it ({reasons})"
    group = allowed[0]
    candidates = [n for n in nodes if n.group is group]
    if not candidates:
        return f"pod {pod.name} stays Pending: node group {group.name} has no nodes (max size 0)"
    best = max(candidates, key=lambda n: n.free.get("cpu", 0) + n.free.get("memory", 0) / GIB)
    resource = best.short(pod) or "pods"
    if resource == "disk":
        need = sum(best.images.values()) + pod.image_gib
        have = group.image_room_gib
    elif resource == "pods":
        need, have = 1, best.free["pods"]
    else:
        need, have = pod.requests[resource], best.free.get(resource, 0.0)
    return (f"pod {pod.name} stays Pending: node group {group.name} ({group.nodes} x {group.instance_type}) "
            f"is short of {resource}: needs {_fmt(resource, need)}, a node has {_fmt(resource, max(have, 0))} left"
            f"{_holder(best, resource)}")


def _holder(node: Node, resource: str) -> str:
    """Who holds most of ``resource`` on ``node``: a pod that did not fit may not be the cause (a
    Ray head sized by ``ray.head_cpu`` takes the system node's room before a submitter asks)."""
    if resource not in ("cpu", "memory") or not node.held:
        return ""
    name, requests = max(node.held.items(), key=lambda item: item[1].get(resource, 0.0))
    total = allocatable(node.group.instance_type)[resource]
    field_name = {"cpu": "ray.head_cpu", "memory": "ray.head_memory_gib"}[resource]
    where = f" ({field_name} in the environment spec)" if name.endswith("-head") else ""
    return (f"; {name} holds {_fmt(resource, requests.get(resource, 0.0))} of the node's "
            f"{_fmt(resource, total)} allocatable{where}")


def place(case: str, groups: list[NodeGroup], pods: list[Pod]) -> Placement:
    """Place ``pods`` on ``groups`` at their maximum size; see the module doc for the model."""
    nodes = [Node(group=g, index=i, free=allocatable(g.instance_type))
             for g in groups for i in range(g.nodes)]
    result = Placement(case=case, nodes=nodes)
    for pod in (p for p in pods if p.daemonset):
        for node in nodes:
            if mismatch(pod, node.group) is None:
                if node.short(pod):
                    result.pending.append(_why(pod, [node]).replace(
                        f"pod {pod.name}", f"pod {pod.name} (on {node.name})", 1))
                else:
                    node.place(pod)
    others = sorted((p for p in pods if not p.daemonset),
                    key=lambda p: (p.wave, -p.requests.get("nvidia.com/gpu", 0), -p.requests.get("cpu", 0),
                                   -p.requests.get("memory", 0)))
    for pod in others:
        node = next((n for n in nodes if mismatch(pod, n.group) is None and n.short(pod) is None), None)
        if node is None:
            result.pending.append(_why(pod, nodes))
        else:
            node.place(pod)
    return result


def render(placement: Placement) -> str:
    """A table: each node, what runs on it, and what is left."""
    lines = [f"case: {placement.case}"]
    for node in placement.nodes:
        alloc = allocatable(node.group.instance_type)
        used_cpu = alloc["cpu"] - node.free["cpu"]
        used_mem = alloc["memory"] - node.free["memory"]
        lines.append(f"  {node.name:<14} {node.group.instance_type:<13} cpu {used_cpu:6.2f}/{alloc['cpu']:.2f}  "
                     f"mem {used_mem / GIB:6.1f}/{alloc['memory'] / GIB:.1f} GiB  "
                     f"images {sum(node.images.values()):.0f}/{node.group.image_room_gib:.0f} GiB  "
                     f"pods {len(node.pods)}: {', '.join(node.pods) or '-'}")
    lines += [f"  PENDING {line}" for line in placement.pending]
    return "\n".join(lines)
