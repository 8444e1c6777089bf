"""Where a RayJob waits in Kueue's queue, read from the Workloads as kubectl shows them.

Kueue (``kubernetes-sigs/kueue`` tag ``v0.19.2``) gives every queued RayJob one Workload in its
namespace, owned by the RayJob (a controller ``ownerReference``;
``pkg/controller/jobframework/reconciler.go:1606-1636`` ``ConstructWorkload``). Its fields
(``apis/kueue/v1beta2/workload_types.go``): ``spec.priority`` (the WorkloadPriorityClass's
value) and ``spec.priorityClassRef.name``; ``status.conditions``: ``QuotaReserved`` True once the
scheduler reserved the ClusterQueue's quota for it (``status.admission.clusterQueue`` names the
queue), False with reason ``Pending`` and the flavor assigner's message while it waits
(``pkg/scheduler/scheduler.go:1149-1185``, e.g. "couldn't assign flavors to pod set gpu:
insufficient unused quota for nvidia.com/gpu in flavor gpu-gpu, 8 more needed"); ``Admitted``
True once admitted, after which Kueue unsuspends the RayJob (reconciler.go:621-651);
``Finished`` True once the RayJob is Complete or Failed, which frees its quota
(``pkg/controller/core/workload_controller.go:1403-1424``).

Not every pending Workload is in the queue (``pkg/controller/core/workload_controller.go:1400-1430``):
a deactivated one (``spec.active`` false, ``pkg/workload/workload.go:1244-1246``) and one on hold
are taken out. Kueue puts a RayJob's Workload on hold when KubeRay refused the RayJob
(``jobDeploymentStatus`` ValidationFailed, ``pkg/controller/jobs/rayjob/rayjob_controller.go:218-220``
``IsOnHold``): its quota is released with ``QuotaReserved`` False, reason ``OnHold``
(``pkg/controller/jobframework/reconciler.go:463-480``; ``apis/kueue/v1beta2/workload_types.go:1057-1061``),
and it is never requeued, so it holds nothing and no job waits behind it.

Pending Workloads are admitted in queue order: higher ``spec.priority`` first, then the older
``metadata.creationTimestamp`` (the eviction's time for one requeued after a PodsReady timeout), then uid (``pkg/cache/queue/cluster_queue.go:1057-1090``,
``pkg/workload/workload.go:1148-1168``); BestEffortFIFO lets one that fits pass one that does
not. Every queued RayJob of the namespace names the one LocalQueue of ClusterQueue ``raytrain``
(environment/queueing.py), so the namespace's Workloads are one queue.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from raytrain_eks.backends.eks import kubectl

WORKLOADS = "workloads.kueue.x-k8s.io"
"""The resource, by its full name: ``workloads`` alone may name another API group's kind."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Place:
    """One RayJob's place in the queue."""

    workload: str
    """Its Workload's name."""
    state: str
    """``queued``, ``reserved`` (quota held, admission checks pending), ``admitted``, ``finished``,
    or out of the queue: ``on hold`` (KubeRay refused the RayJob) or ``inactive`` (deactivated)."""
    position: int = 0
    """1 = admitted next (queued only)."""
    queued: int = 0
    """How many RayJobs are queued."""
    ahead: tuple[str, ...] = ()
    """The queued RayJobs Kueue considers before it."""
    holding: tuple[str, ...] = ()
    """The admitted RayJobs that hold the quota now (until they end)."""
    priority_class: str = ""
    message: str = ""
    """Kueue's reason, while queued (the QuotaReserved condition's message)."""


NO_WORKLOAD = ("suspended, with no Kueue Workload yet (Kueue makes one for a RayJob labelled for its LocalQueue; "
               "without Kueue it stays suspended)")
"""What a suspended RayJob without a Workload means."""


def list_workloads(namespace: str) -> list[dict[str, Any]] | None:
    """The namespace's Workloads; None when Kueue is not installed (no such resource type) or
    they cannot be read (the RayJob's own status still says where it stands)."""
    proc = kubectl("get", WORKLOADS, "-n", namespace, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    return workload_items(proc.stdout)


def workload_items(listing: str) -> list[dict[str, Any]]:
    """The Workloads of ``kubectl get workloads.kueue.x-k8s.io -o json``'s output."""
    return json.loads(listing or "{}").get("items") or []


def _true(workload: dict[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (workload.get("status") or {}).get("conditions") or [])


def _out_of_queue(workload: dict[str, Any]) -> str:
    """Why a Workload without quota is not in the queue ("" when it is)."""
    if (workload.get("spec") or {}).get("active") is False:
        return "inactive"
    on_hold = any(c.get("type") == "QuotaReserved" and c.get("status") == "False" and c.get("reason") == "OnHold"
                  for c in (workload.get("status") or {}).get("conditions") or [])
    return "on hold" if on_hold else ""


def _owner(workload: dict[str, Any]) -> str:
    """The RayJob's name; ``RayCluster NAME`` for a slice of the long-lived cluster (it holds and
    waits for quota like a job: environment/queueing.py ``raycluster_queue_metadata``)."""
    refs = (workload.get("metadata") or {}).get("ownerReferences") or []
    ref = next((r for r in refs if r.get("kind") in ("RayJob", "RayCluster")), {})
    return f"RayCluster {ref.get('name', '')}" if ref.get("kind") == "RayCluster" else ref.get("name", "")


def _message(workload: dict[str, Any]) -> str:
    return next((c.get("message", "") for c in (workload.get("status") or {}).get("conditions") or []
                 if c.get("type") == "QuotaReserved" and c.get("status") == "False"), "")


def _order_time(workload: dict[str, Any]) -> str:
    """Kueue's ``Ordering.GetQueueOrderTimestamp`` (``pkg/workload/workload.go``) at its default
    ``requeuingStrategy.timestamp: Eviction``: a Workload evicted for a PodsReady timeout (a
    ``waitForPodsReady`` a team's own Kueue may turn on) queues from its eviction; any other, its
    preempted ones included, from its creation."""
    evicted = next((c for c in (workload.get("status") or {}).get("conditions") or []
                    if c.get("type") == "Evicted" and c.get("status") == "True"
                    and c.get("reason") == "PodsReadyTimeout"), None)
    return evicted.get("lastTransitionTime", "") if evicted else (workload.get("metadata") or {}).get("creationTimestamp", "")


def _order(workload: dict[str, Any]) -> tuple:
    meta = workload.get("metadata") or {}
    return (-int((workload.get("spec") or {}).get("priority") or 0), _order_time(workload), meta.get("uid", ""))


def places(workloads: list[dict[str, Any]]) -> dict[str, Place]:
    """RayJob name -> its place, for every RayJob with a Workload."""
    live = [w for w in workloads if _owner(w) and not _true(w, "Finished")]
    holding = tuple(sorted(_owner(w) for w in live if _true(w, "QuotaReserved")))
    queued = sorted((w for w in live if not _true(w, "QuotaReserved") and not _out_of_queue(w)), key=_order)
    out = {}
    for w in workloads:
        name, owner = w["metadata"]["name"], _owner(w)
        priority = ((w.get("spec") or {}).get("priorityClassRef") or {}).get("name", "")
        if not owner:
            continue
        if _true(w, "Finished"):
            out[owner] = Place(workload=name, state="finished", priority_class=priority)
        elif _true(w, "QuotaReserved"):
            # Admitted only once its admission checks pass (none on this app's ClusterQueue; a
            # team's own may have some): until then the quota is held and the RayJob still suspended.
            out[owner] = Place(workload=name, state="admitted" if _true(w, "Admitted") else "reserved",
                               holding=holding, priority_class=priority)
        elif _out_of_queue(w):
            out[owner] = Place(workload=name, state=_out_of_queue(w), holding=holding, priority_class=priority)
        else:
            index = queued.index(w)
            out[owner] = Place(workload=name, state="queued", position=index + 1, queued=len(queued),
                               ahead=tuple(_owner(a) for a in queued[:index]), holding=holding,
                               priority_class=priority, message=_message(w))
    return out


def place_of(rayjob: str, namespace: str) -> Place | None:
    """Where ``rayjob`` waits; None without Kueue or without a Workload (not queued)."""
    workloads = list_workloads(namespace)
    return None if workloads is None else places(workloads).get(rayjob)


def suspended_line(place: Place | None) -> str:
    """What a suspended RayJob waits for: its place in the queue, or that it has no Workload."""
    return describe(place) if place else NO_WORKLOAD


def describe(place: Place) -> str:
    """One line: queued (behind which runs, and why), or admitted."""
    if place.state == "queued":
        behind = [*(f"{r} (admitted)" for r in place.holding), *(f"{r} (queued)" for r in place.ahead)]
        return (f"queued: {place.position} of {place.queued} in Kueue's queue (Workload {place.workload}, priority "
                f"{place.priority_class or '-'}), behind {', '.join(behind) or 'nothing: admitted at the next pass'}"
                f"{'; Kueue: ' + place.message if place.message else ''}")
    if place.state == "admitted":
        return f"admitted by Kueue (Workload {place.workload}): KubeRay creates its cluster; its deadlines count from now"
    if place.state == "reserved":
        return (f"quota reserved by Kueue (Workload {place.workload}): waiting for its admission checks; "
                "the RayJob stays suspended until it is admitted")
    if place.state == "on hold":
        return (f"on hold in Kueue (Workload {place.workload}): KubeRay refused the RayJob (ValidationFailed), so Kueue "
                "holds no quota for it and does not queue it")
    if place.state == "inactive":
        return f"deactivated in Kueue (Workload {place.workload}, spec.active false): not queued until it is reactivated"
    return f"finished in Kueue (Workload {place.workload}): its quota is free"


def column(place: Place | None, deployment: str) -> str:
    """``raytrain-eks list``'s queue column: ``queued N/M``, ``admitted`` while it runs, else ``-``
    (an ended RayJob's quota is free once Kueue marks its Workload Finished, at its next pass)."""
    if place is None or place.state == "finished" or deployment in ("Complete", "Failed", "ValidationFailed"):
        return "-"
    return f"queued {place.position}/{place.queued}" if place.state == "queued" else place.state


class QueueWatch:
    """What ``submit`` says of a followed RayJob's place in the queue: each new :func:`describe`
    line while it is suspended, then once that it was admitted. KubeRay keeps a suspended RayJob
    ``Suspended``, with no cluster and no deadline counting (``ray-project/kuberay`` tag
    ``ray-operator/v1.7.0``, ``rayjob_controller.go:411-418``); unsuspended, it starts again from
    New and ``initRayJobStatusIfNeed`` sets ``status.startTime``, from which both
    ``activeDeadlineSeconds`` and ``preRunningDeadlineSeconds`` count, to that moment (:887-917)."""

    def __init__(self, name: str, namespace: str) -> None:
        self.name, self.namespace = name, namespace
        self.last = ""
        self.queued = False

    def line(self, rayjob: dict[str, Any]) -> str:
        """The line to show now ("" when nothing changed)."""
        suspended = bool((rayjob.get("spec") or {}).get("suspend"))
        if not suspended and not self.queued:
            return ""
        place = place_of(self.name, self.namespace)
        if suspended:
            self.queued = True
            line = suspended_line(place)
        else:
            self.queued = False
            line = describe(place) if place else "unsuspended: KubeRay creates its cluster"
        if line == self.last:
            return ""
        self.last = line
        return line
