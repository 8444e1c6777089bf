"""The queue order ``raytrain_eks.backends.kueue_queue`` reads off Workloads, held to Kueue's own.

Kueue (``kubernetes-sigs/kueue`` tag ``v0.19.2``) sorts a ClusterQueue's pending Workloads by
priority, then ``workload.Ordering.GetQueueOrderTimestamp`` (``pkg/workload/workload.go``), then
uid (``pkg/cache/queue/cluster_queue.go``, the ``queueOrderingFunc``). That timestamp is the
``creationTimestamp``, except for a Workload whose ``Evicted`` condition is True with reason
``PodsReadyTimeout`` while ``waitForPodsReady.requeuingStrategy.timestamp`` is ``Eviction``
(the default, ``apis/config/v1beta2/defaults.go``): then it is that condition's
``lastTransitionTime``, so a requeued job goes to the back of its priority. Eviction by
preemption keeps the creation time (``pkg/workload/workload_test.go`` ``TestGetQueueOrderTimestamp``).
A team's own Kueue (``cluster.existing``) may run with ``waitForPodsReady`` on.
"""
from __future__ import annotations

from raytrain_eks.backends.kueue_queue import places


def _workload(name: str, created: str, *conditions: dict) -> dict:
    return {"metadata": {"name": f"rayjob-{name}", "uid": name, "creationTimestamp": created,
                         "ownerReferences": [{"kind": "RayJob", "name": name}]},
            "spec": {"priority": 100}, "status": {"conditions": list(conditions)}}


def _evicted(reason: str, at: str) -> dict:
    return {"type": "Evicted", "status": "True", "reason": reason, "lastTransitionTime": at}


def test_a_workload_requeued_after_a_pods_ready_timeout_waits_behind_those_queued_before_its_eviction():
    requeued = _workload("a", "2026-12-04T01:00:00Z", _evicted("PodsReadyTimeout", "2026-12-04T03:00:00Z"))
    later = _workload("b", "2026-12-04T02:00:00Z")
    got = places([requeued, later])
    assert (got["b"].position, got["a"].position) == (1, 2)
    assert got["a"].ahead == ("b",)


def test_a_workload_evicted_by_preemption_keeps_its_creation_time_in_the_queue():
    preempted = _workload("a", "2026-12-04T01:00:00Z", _evicted("Preempted", "2026-12-04T03:00:00Z"))
    later = _workload("b", "2026-12-04T02:00:00Z")
    got = places([preempted, later])
    assert (got["a"].position, got["b"].position) == (1, 2)


def test_an_eviction_that_is_over_no_longer_moves_the_workload():
    over = _workload("a", "2026-12-04T01:00:00Z", {**_evicted("PodsReadyTimeout", "2026-12-04T03:00:00Z"),
                                                  "status": "False"})
    later = _workload("b", "2026-12-04T02:00:00Z")
    assert places([over, later])["a"].position == 1


def test_quota_reserved_is_not_admitted_until_the_admission_checks_pass():
    """Kueue v0.19.2's Workload API: ``QuotaReserved`` when the scheduler assigns quota,
    ``Admitted`` only once every admission check of the ClusterQueue is Ready too; the job is
    unsuspended only then (a reviewer's reading of the v0.19.2 source, not re-checked here). A team's own
    ClusterQueue may have checks (ProvisioningRequest): submit must not say admitted early."""
    from raytrain_eks.backends.kueue_queue import describe

    reserved = _workload("a", "2026-12-04T01:00:00Z", {"type": "QuotaReserved", "status": "True"})
    admitted = _workload("b", "2026-12-04T01:00:00Z", {"type": "QuotaReserved", "status": "True"},
                         {"type": "Admitted", "status": "True"})
    got = places([reserved, admitted])
    assert (got["a"].state, got["b"].state) == ("reserved", "admitted")
    assert describe(got["a"]).startswith("quota reserved by Kueue (Workload rayjob-a): waiting for its admission checks")


def test_a_workload_on_hold_or_deactivated_is_out_of_the_queue_and_no_one_waits_behind_it():
    """Kueue v0.19.2: a RayJob KubeRay refused (``ValidationFailed``) is on hold
    (``pkg/controller/jobs/rayjob/rayjob_controller.go:218-220``): the job reconciler releases its
    quota with ``QuotaReserved`` False, reason ``OnHold`` (``pkg/controller/jobframework/reconciler.go:463-480``),
    and the workload controller takes it out of the queue, as it does a Workload whose
    ``spec.active`` is false (``pkg/controller/core/workload_controller.go:1400-1430``)."""
    from raytrain_eks.backends.kueue_queue import column, describe

    on_hold = _workload("a", "2026-12-04T01:00:00Z", {"type": "QuotaReserved", "status": "False", "reason": "OnHold",
                                                      "message": "Job is on hold"})
    inactive = {**_workload("b", "2026-12-04T01:30:00Z"), "spec": {"priority": 100, "active": False}}
    waiting = _workload("c", "2026-12-04T02:00:00Z", {"type": "QuotaReserved", "status": "False", "reason": "Pending"})
    got = places([on_hold, inactive, waiting])
    assert (got["c"].state, got["c"].position, got["c"].queued, got["c"].ahead) == ("queued", 1, 1, ())
    assert (got["a"].state, got["b"].state) == ("on hold", "inactive")
    assert describe(got["a"]).startswith("on hold in Kueue (Workload rayjob-a): KubeRay refused the RayJob")
    assert describe(got["b"]).startswith("deactivated in Kueue (Workload rayjob-b, spec.active false)")
    assert column(got["a"], "Suspended") == "on hold"
