"""Kueue in the kubectl double (tests/raytrain_eks/kubectl_double.py): its RayJob webhook, its job
reconciler and its scheduler, one pass of each per reconcile tick of the double.

Modelled on ``kubernetes-sigs/kueue`` tag ``v0.19.2`` (default configuration: BestEffortFIFO,
no admission checks, ``UnadmittedWorkloadsObservability`` off), with the ClusterQueue,
ResourceFlavors and WorkloadPriorityClasses the add-on installs (``state["kueue"]``:
environment/queueing.py ``kueue_objects``; absent: Kueue is not installed):

- webhook (``pkg/controller/jobframework/defaults.go:36-46``, ``utils.go:147-150``): a RayJob
  created with the queue-name label gets ``spec.suspend = true``.
- job reconciler (``pkg/controller/jobframework/reconciler.go`` ``ReconcileGenericJob``; a
  ``clusterSelector`` RayJob is skipped, ``pkg/controller/jobs/rayjob/rayjob_controller.go:116-120``):
  ``ensureOneWorkload`` creates the job's Workload (:980-, ``ConstructWorkload`` :1606-1636): named
  ``rayjob-<name>-<5 hex>`` (``workload_names.go:85-96``), owned by the RayJob (controller
  reference), labelled ``kueue.x-k8s.io/job-uid``, with the LocalQueue as ``spec.queueName``, the
  priority class as ``spec.priorityClassRef`` and its value as ``spec.priority``, one pod set per
  head, worker group and submitter; a finished job (``rayjob_controller.go:222-228``: Complete or
  Failed) finishes its Workload (reconciler.go:483-504: condition ``Finished``, reason
  ``Succeeded``/``Failed``); a suspended job whose Workload is admitted is unsuspended
  (reconciler.go:621-651, ``startJob``; ``RunWithPodSetsInfo`` sets ``spec.suspend = false``).
- scheduler: pending Workloads in queue order, higher ``spec.priority`` first, then the older
  ``creationTimestamp``, then uid (``pkg/cache/queue/cluster_queue.go:1057-1090``,
  ``pkg/workload/workload.go:1148-1168``); under BestEffortFIFO one that does not fit does not
  block those behind it. One that fits the ClusterQueue's unused quota (the flavor assigner, ported
  in tests/charts/charts_oracles/kueue_rayjob.py) gets ``status.admission`` and the conditions
  ``QuotaReserved`` (reason ``QuotaReserved``, ``workload.go:893-905``) and ``Admitted`` (reason
  ``Admitted``, ``admissionchecks.go:39-66``); one that does not gets ``QuotaReserved`` False with
  reason ``Pending`` and the flavor assigner's message (``pkg/scheduler/scheduler.go:1149-1185``).
  Nothing is preempted (the ClusterQueue preempts Never).
- the long-lived RayCluster (``state["long_lived"]``: ``raycluster`` as the charts wrote it,
  ``replicas`` group -> the workers Ray's autoscaler asked for), when Kueue manages it
  (``ray.io/raycluster`` integrated and the cluster labelled: tests/charts/charts_oracles/
  kueue_raycluster.py): an elastic Workload per slice (site/content/en/docs/concepts/
  elastic_workload.md "Lifecycle"; ``pkg/workloadslicing/workloadslicing.go``): a scale-up is a
  new slice, queued like a RayJob's Workload and counted without the slice it replaces
  (``ReplacedWorkloadSlice`` :343-355), which is finished with reason ``WorkloadSliceReplaced``
  once the new one is admitted (:332); a scale-down shrinks the current slice in place. Until its
  slice is admitted a worker stays gated (``kueue.x-k8s.io/elastic-job``): it holds no node
  (node_double.py). An unmanaged cluster's workers take their nodes unseen by Kueue.
- a finished Workload leaves the cache, so its quota is free for the next scheduling pass
  (``pkg/controller/core/workload_controller.go:1403-1424``); a deleted RayJob's Workload goes
  with it (owner reference: the garbage collector).

The real Kueue v0.19.2 does all of this on the cluster tier's control plane (tests/cluster/:
admission, the hold on GPU quota, priority order, the elastic RayCluster's slices). This model
stays for the tiers that run without that plane (``make test``, CI: its cold build takes over an
hour here): the run commands and the pipeline's Smoke follow a RayJob past the head's start, which
the plane cannot reach (nothing runs in KWOK's pods), and need a queue in front of it.
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "charts"))  # the Kueue oracle is the flavor assigner

from charts_oracles import kueue_raycluster  # noqa: E402
from charts_oracles.kueue_rayjob import (  # noqa: E402
    PRIORITY_CLASS_LABEL, admission, managed, pod_requests, pod_sets, queue_name,
)

KUEUE_API = "kueue.x-k8s.io/v1beta2"
WORKLOADS = "workloads.kueue.x-k8s.io"
"""What kubectl is asked for (``kubectl get workloads.kueue.x-k8s.io``)."""
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def installed(state: dict) -> bool:
    return bool(state.get("kueue"))


def _objects(state: dict, kind: str) -> list[dict]:
    return [o for o in state["kueue"]["objects"] if o["kind"] == kind]


def timestamp(state: dict) -> str:
    """Now, as the API server writes a time: the double's clock (``now``) moves one second per
    reconcile tick, so objects created within one tick share a time (Kueue then orders by uid)."""
    now = state.get("now", 0)
    return f"2026-12-01T{20 + now // 3600:02d}:{now // 60 % 60:02d}:{now % 60:02d}Z"


def on_create(state: dict, rayjob: dict) -> None:
    """The API server (uid, creationTimestamp) and Kueue's mutating webhook, at creation."""
    state["seq"] = state.get("seq", 0) + 1
    meta = rayjob["metadata"]
    meta.setdefault("uid", f"00000000-0000-0000-0000-{state['seq']:012d}")
    meta.setdefault("creationTimestamp", timestamp(state))
    if installed(state) and queue_name(rayjob):
        rayjob["spec"]["suspend"] = True


def _condition(workload: dict, kind: str) -> dict | None:
    return next((c for c in (workload.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def _true(workload: dict, kind: str) -> bool:
    return (_condition(workload, kind) or {}).get("status") == "True"


def _set_condition(state: dict, workload: dict, kind: str, status: str, reason: str, message: str) -> None:
    conditions = workload.setdefault("status", {}).setdefault("conditions", [])
    old = _condition(workload, kind)
    since = old["lastTransitionTime"] if old and old["status"] == status else timestamp(state)
    conditions[:] = [c for c in conditions if c["type"] != kind] + [
        {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}]


def _owner(workload: dict) -> str:
    return workload["metadata"]["ownerReferences"][0]["name"]


def _of_cluster(workload: dict) -> bool:
    return workload["metadata"]["ownerReferences"][0]["kind"] == "RayCluster"


def _new_workload(state: dict, job: dict, sets: list[dict]) -> dict:
    meta, kind = job["metadata"], job.get("kind", "RayJob")
    state["seq"] = state.get("seq", 0) + 1
    # workload_names.go:85-96; a cluster's slices also by their sequence (the double's own naming)
    key = f"{kind}\nray.io\n{meta['name']}\n{meta['uid']}" + (f"\n{state['seq']}" if kind == "RayCluster" else "")
    digest = hashlib.sha1(key.encode()).hexdigest()[:5]
    priority_class = (meta.get("labels") or {}).get(PRIORITY_CLASS_LABEL, "")
    values = {o["metadata"]["name"]: o["value"] for o in _objects(state, "WorkloadPriorityClass")}
    spec = {"queueName": queue_name(job), "active": True, "priority": values.get(priority_class, 0),
            "podSets": [{"name": ps["name"], "count": ps["count"]} for ps in sets]}
    if priority_class:
        spec["priorityClassRef"] = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": priority_class}
    return {"apiVersion": KUEUE_API, "kind": "Workload",
            "metadata": {"name": f"{kind.lower()}-{meta['name']}-{digest}", "namespace": meta.get("namespace", "ray"),
                         "uid": f"11111111-0000-0000-0000-{state['seq']:012d}",
                         "creationTimestamp": timestamp(state), "labels": {JOB_UID_LABEL: meta["uid"]},
                         "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": kind, "name": meta["name"],
                                              "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": spec, "status": {}}


def _job_and_sets(state: dict, workload: dict) -> tuple[dict, list[dict]]:
    """The object a Workload stands for and the pod sets it reserves (a cluster slice: its counts)."""
    if not _of_cluster(workload):
        job = state["rayjobs"][_owner(workload)]
        return job, pod_sets(job)
    doc = state["long_lived"]["raycluster"]
    counts = {ps["name"]: ps["count"] for ps in workload["spec"]["podSets"]}
    return doc, kueue_raycluster.pod_sets(doc, counts)


def collect(state: dict) -> None:
    """The garbage collector: a Workload whose owner RayJob is gone goes too."""
    workloads = state.setdefault("workloads", {})
    for name in [n for n, w in workloads.items() if not _of_cluster(w) and _owner(w) not in state["rayjobs"]]:
        del workloads[name]


def _reconcile_long_lived(state: dict) -> None:
    """The elastic RayCluster's slices follow the replicas the autoscaler wrote."""
    long_lived = state.get("long_lived")
    if not long_lived or not kueue_raycluster.managed(long_lived["raycluster"]):
        return
    doc = long_lived["raycluster"]
    doc["metadata"].setdefault("uid", "22222222-0000-0000-0000-000000000001")
    want = kueue_raycluster.pod_sets(doc, long_lived.get("replicas") or {})
    slices = [w for w in state["workloads"].values() if _of_cluster(w) and not _true(w, "Finished")]
    latest = max(slices, key=lambda w: w["metadata"]["uid"]) if slices else None
    have = {ps["name"]: ps["count"] for ps in (latest["spec"]["podSets"] if latest else [])}
    if latest is None or (_true(latest, "QuotaReserved") and any(ps["count"] > have[ps["name"]] for ps in want)):
        workload = _new_workload(state, doc, want)  # a scale-up: a new slice
        state["workloads"][workload["metadata"]["name"]] = workload
    else:
        latest["spec"]["podSets"] = [{"name": ps["name"], "count": ps["count"]} for ps in want]  # in place


def long_lived_workers(state: dict) -> dict[str, int]:
    """Group -> the long-lived cluster's workers that hold nodes: the admitted slice's when Kueue
    manages it (the others are gated), else every one the autoscaler asked for."""
    long_lived = state.get("long_lived")
    if not long_lived:
        return {}
    if not (installed(state) and kueue_raycluster.managed(long_lived["raycluster"])):
        return dict(long_lived.get("replicas") or {})
    held = [w for w in (state.get("workloads") or {}).values()
            if _of_cluster(w) and _true(w, "QuotaReserved") and not _true(w, "Finished")]
    return {ps["name"]: ps["count"] for w in held for ps in w["spec"]["podSets"] if ps["name"] != "head"}


def _reconcile_jobs(state: dict) -> None:
    collect(state)
    workloads = state["workloads"]
    owned = {_owner(w): w for w in workloads.values() if not _of_cluster(w)}
    _reconcile_long_lived(state)
    for rayjob in state["rayjobs"].values():
        if not managed(rayjob):
            continue
        workload = owned.get(rayjob["metadata"]["name"])
        if workload is None:
            workload = _new_workload(state, rayjob, pod_sets(rayjob))
            workloads[workload["metadata"]["name"]] = workload
        deployment = (rayjob.get("status") or {}).get("jobDeploymentStatus")
        if deployment in ("Complete", "Failed") and not _true(workload, "Finished"):
            succeeded = (rayjob.get("status") or {}).get("jobStatus") == "SUCCEEDED"
            _set_condition(state, workload, "Finished", "True", "Succeeded" if succeeded else "Failed",
                           (rayjob.get("status") or {}).get("message", ""))
        elif rayjob["spec"].get("suspend") and _true(workload, "Admitted"):
            rayjob["spec"]["suspend"] = False  # startJob


def _usage(state: dict, cluster_queue: dict, flavors: list[dict], live: list[dict], replacing: bool) -> dict:
    """What the reserved Workloads hold; a cluster's new slice is counted without the one it replaces."""
    usage: dict = {}
    for workload in live:
        if _true(workload, "QuotaReserved") and not _true(workload, "Finished") \
                and not (replacing and _of_cluster(workload)):
            job, sets = _job_and_sets(state, workload)
            admission(job, cluster_queue, flavors, usage, sets=sets)
    return usage


def _schedule(state: dict) -> None:
    (cluster_queue,) = _objects(state, "ClusterQueue")
    flavors = _objects(state, "ResourceFlavor")
    live = [w for w in state["workloads"].values() if not _true(w, "Finished")]
    pending = sorted((w for w in live if not _true(w, "QuotaReserved")),
                     key=lambda w: (-w["spec"]["priority"], w["metadata"]["creationTimestamp"], w["metadata"]["uid"]))
    for workload in pending:
        job, sets = _job_and_sets(state, workload)
        usage = _usage(state, cluster_queue, flavors, live, replacing=_of_cluster(workload))
        chosen, problems = admission(job, cluster_queue, flavors, usage, sets=sets)
        if problems:
            _set_condition(state, workload, "QuotaReserved", "False", "Pending", "; ".join(problems))
            continue
        if _of_cluster(workload):
            for old in (w for w in live if _of_cluster(w) and w is not workload and _true(w, "QuotaReserved")):
                _set_condition(state, old, "Finished", "True", "WorkloadSliceReplaced",
                               "Replaced to accommodate a new workload slice")
        cq = cluster_queue["metadata"]["name"]
        by_name = {ps["name"]: ps for ps in sets}
        workload["status"]["admission"] = {"clusterQueue": cq, "podSetAssignments": [
            {"name": ps, "count": by_name[ps]["count"],
             "flavors": {r: flavor for r in pod_requests(by_name[ps]["template"]["spec"])}}
            for ps, flavor in chosen.items()]}
        _set_condition(state, workload, "QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue {cq}")
        _set_condition(state, workload, "Admitted", "True", "Admitted", "The workload is admitted")


def reconcile(state: dict) -> None:
    """One pass of Kueue: the job reconciler (Workloads, finishing), the scheduler (admission),
    the job reconciler again (an admitted job is unsuspended)."""
    if not installed(state):
        return
    _reconcile_jobs(state)
    _schedule(state)
    _reconcile_jobs(state)


def workloads(state: dict) -> list[dict]:
    """``kubectl get workloads.kueue.x-k8s.io -n NS -o json``'s items."""
    return list((state.get("workloads") or {}).values())
