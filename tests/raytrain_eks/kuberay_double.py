"""KubeRay v1.7.0 in the kubectl doubles: the RayJob controller and the RayCluster controller, one
reconcile of each per tick of the double's clock. The CLI's double (kubectl_double.py) and the
pipeline's (pipeline/fake_kubectl.py) are kubectl fronts on this one controller; what differs
between their worlds (the nodes under a cluster, what a finished Ray job writes, the scenario's
knobs) is a :class:`World`.

Modelled on ``ray-project/kuberay`` tag ``ray-operator/v1.7.0``:
``ray-operator/controllers/ray/rayjob_controller.go`` (Reconcile's switch on
``status.jobDeploymentStatus``) and ``ray-operator/apis/ray/v1/rayjob_types.go``:

- ``""`` (New): the controller adds its stop-job finalizer and initialises the status
  (initRayJobStatusIfNeed :887-917): ``jobId``, ``rayClusterName`` (``<name>-<5 chars>``, or the
  clusterSelector's cluster), ``jobStatus = ""``, ``startTime`` (both deadlines count from it);
  -> ``Initializing``. The job's own RayCluster is created (:World.cluster_created).
- ``Initializing``: with ``spec.suspend`` -> ``Suspending`` first (:180-182); then
  ``preRunningDeadlineSeconds`` (``pre_running_deadline_after`` reconciles since ``startTime``):
  ``Failed`` with ``reason = PreRunningDeadlineExceeded`` (:1247-1262); else it stays while the
  RayCluster is not ``ready`` (:207-215: its pods wait for room on the nodes, World.placed, then
  World.cluster_ready); then, in K8sJobMode, creates the submitter Job; -> ``Running`` with
  ``jobStatus`` unchanged (``""``: only the Running case reads the dashboard, :238).
- suspension (:366-418, 1043-1060): only ``Initializing`` and ``Running`` go ``Suspending``;
  ``Suspending`` deletes the cluster and clears ``rayClusterName``, ``dashboardURL``, ``jobId``,
  ``reason``, ``message``, ``jobStatus`` (``startTime``, ``failed`` stay) -> ``Suspended``, which
  stays while ``spec.suspend`` is true and goes back to New when it is false (a new
  ``startTime``: time spent suspended counts against no deadline). The controller requeues at once
  after each status update, so a suspended RayJob is ``Suspended`` by the first poll. Kueue
  (kueue_double.py) suspends a labelled RayJob at creation and unsuspends it when admitted.
- time: each tick (a ``get rayjob NAME``) is Kueue's pass, then one KubeRay reconcile of every
  RayJob the world moves (``now`` counts the ticks; ``history`` records each status a RayJob
  took, with its tick).
- ``Running``: ``jobStatus`` is the dashboard's (PENDING, then RUNNING). Terminal only when the
  Ray job is terminal AND the submitter has finished (K8sJobMode, kuberay PR 1919;
  World.driver_finished): then ``Complete`` (SUCCEEDED/STOPPED) or ``Failed`` with
  ``reason = AppFailed`` (FAILED), and ``endTime``. The Ray job's end is World.outcome (what the
  job writes before it ends is the world's).
- validation, before the switch on every reconcile (rayjob_controller.go:144-161): a spec
  KubeRay refuses goes ``ValidationFailed`` with ``reason = ValidationFailed`` and the error as
  ``message``; modelled: ``backoffLimit > 0`` with a ``clusterSelector`` (utils/validation.go:575-576).
- retries: a ``Failed`` RayJob with ``status.failed < backoffLimit + 1`` (reason not
  ``DeadlineExceeded``) becomes ``Retrying`` in the same reconcile, so ``Failed`` is never seen
  then (rayjob_controller.go:452, 518-556); ``Retrying`` deletes the cluster and the submitter,
  clears the same fields as ``Suspending`` and goes back to New (rayjob_controller.go:366-410):
  the next attempt has a new cluster and a new Ray job.
- ``kubectl apply --server-side`` of a RayJob that exists succeeds: it changes the spec and keeps
  the status, and a ``Complete``/``Failed`` RayJob is not run again (rayjob_controller.go:420-447
  only cleans up).
- ``activeDeadlineSeconds`` (``deadline_after``: reconciles in Running): the Running case checks
  it first (rayjob_controller.go:249-257, ``checkActiveDeadlineAndUpdateStatusIfNeeded``
  :1234-1246): ``Failed`` with ``reason = DeadlineExceeded``; ``jobStatus`` keeps the last value
  (RUNNING): the Ray job is not stopped.
- delete: a RayJob whose jobStatus is not terminal gets StopJob on its Ray job first (the
  finalizer, rayjob_controller.go:112-137); the double records the stopped job id, except under
  ``--cascade=foreground`` when the RayJob owns its cluster (the collector deletes it first).
  Its own RayCluster is a controller reference of the RayJob (rayjob_controller.go:1021): the
  garbage collector deletes it; a clusterSelector cluster is not owned and stays.

The RayCluster (``ray-operator/controllers/ray/raycluster_controller.go``), as the pipeline's
world keeps it (``state["clusters"]``: the object and its pods):

- Recreate (``shouldRecreatePodsForUpgrade``): pods are recreated only when
  ``spec.upgradeStrategy.type`` is ``Recreate`` AND the head pod's
  ``ray.io/upgrade-strategy-recreate-hash`` annotation differs from the spec's hash; the hash is
  ``utils/util.go`` ``GenerateHashWithoutReplicasAndWorkersToDelete`` (the whole spec, pod-template
  labels and annotations included, less workers' replicas / min / max / workersToDelete,
  tolerations and scheduling gates, and upgradeStrategy), ported in :func:`recreate_hash`. An
  unchanged spec, or a change without Recreate, leaves running pods (and their image IDs) alone.
  The drivers of RayJobs running on the recreated head die with it (:func:`head_deleted`).
- status (``calculateStatus``): ``state: ready`` once head + desired workers exist and all are
  Running and Ready (``utils/util.go`` ``CheckAllPodsRunning``), and never reset afterwards;
  ``observedGeneration`` follows the generation it reconciled. A Recreate (``reconcilePods``)
  deletes every pod first: they stay Running and Ready with ``metadata.deletionTimestamp`` set
  (Terminating) for one reconcile, and the new pods (new ``uid``) are created in the next one. New
  pods start Pending with no image ID and run (Ready, ``imageID`` = the reference they were pulled
  by, as containerd reports) at the next reconcile; a head on ``crashloop_image`` (a digest)
  never becomes Ready.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import json
import uuid

import kueue_double

TERMINAL_JOB = ("SUCCEEDED", "FAILED", "STOPPED")
"""The Ray job's terminal statuses (rayjob_types.go IsJobTerminal)."""
FINISHED = ("Complete", "Failed", "ValidationFailed")
"""Deployment statuses KubeRay's switch only cleans up after (rayjob_controller.go:420-447)."""
STOP_FINALIZER = "ray.io/rayjob-stopjob-finalizer"  # utils/constant.go RayJobStopJobFinalizer
HASH_KEY = "ray.io/upgrade-strategy-recreate-hash"  # utils/constant.go UpgradeStrategyRecreateHashKey
CLUSTER_SUFFIX = "x7k2p"
"""utils.GenerateRayClusterName's random 5 characters, fixed: the first attempt's cluster."""


def selected_cluster(job: dict) -> str:
    """The long-lived RayCluster a clusterSelector RayJob runs on ("": its own cluster)."""
    return (job["spec"].get("clusterSelector") or {}).get("ray.io/cluster", "")


def visible(job: dict) -> dict:
    """The RayJob as the API server answers it (without the double's bookkeeping)."""
    return {k: v for k, v in job.items() if k != "_fake"}


class World:
    """What lies around KubeRay in a double: the scenario's knobs (``knobs``: the CLI's state,
    the pipeline's scenario) and the hooks below. The defaults: a cluster is placed at once and
    ready ``cluster_ready_after`` reconciles later, the submitter runs ``submitter_runs``
    reconciles in Running, the Ray job ends as ``outcomes`` (one per attempt) then ``outcome`` say."""

    def __init__(self, state: dict, knobs: dict) -> None:
        self.state, self.knobs = state, knobs

    def moves(self, job: dict) -> bool:
        """Whether a tick reconciles it (the pipeline moves its long-lived cluster's jobs on lists)."""
        return True

    def cluster_created(self, job: dict) -> None:
        """KubeRay created the job's own RayCluster (``status.rayClusterName``)."""

    def cluster_deleted(self, job: dict) -> None:
        """KubeRay (retry, suspension) or the garbage collector (delete) deleted its own RayCluster."""

    def placed(self, job: dict) -> bool:
        """Whether the nodes have room for its cluster's pods now."""
        return True

    def cluster_ready(self, job: dict) -> bool:
        """Whether its RayCluster's status is ``ready`` at this reconcile (placed at ``placed_at``)."""
        fake = job["_fake"]
        return fake["reconciles"] - fake["placed_at"] >= self.knobs["cluster_ready_after"]

    def driver_finished(self, job: dict) -> bool:
        """Whether the submitter (``ray job submit``, following the Ray job) has ended by now."""
        fake = job["_fake"]
        return fake["submitter_done"] or fake["reconciles"] - fake["running_since"] > self.knobs["submitter_runs"]

    def outcome(self, job: dict, attempt: int) -> tuple[str, int]:
        """The Ray job's end (``jobStatus``) and its entrypoint's exit code; writes what the job writes."""
        outcomes = self.knobs.get("outcomes") or []
        status = outcomes[attempt] if attempt < len(outcomes) else self.knobs["outcome"]
        return status, 1


def reconcile(world: World, job: dict) -> None:
    """One KubeRay reconcile of a RayJob (with the requeues that follow at once)."""
    status = job.setdefault("status", {})
    fake = job.setdefault("_fake", {"reconciles": 0, "submitter_done": False})
    fake.setdefault("submitter_done", False)
    fake["reconciles"] = fake.get("reconciles", 0) + 1
    step(world, job)
    # KubeRay requeues at once after each status update: a suspended RayJob passes
    # New -> Initializing -> Suspending -> Suspended before anyone polls (rayjob_controller.go:165-181, 366-418)
    while job["spec"].get("suspend") and status.get("jobDeploymentStatus") in ("Initializing", "Suspending"):
        step(world, job)


def _delete_cluster(world: World, job: dict) -> None:
    if job["status"].get("rayClusterName") and not selected_cluster(job):
        world.cluster_deleted(job)


def step(world: World, job: dict) -> None:
    status, fake, spec, knobs = job["status"], job["_fake"], job["spec"], world.knobs
    deployment = status.get("jobDeploymentStatus", "")
    name = job["metadata"]["name"]
    if deployment in FINISHED:
        return
    if spec.get("clusterSelector") and (spec.get("backoffLimit") or 0) > 0:
        status.update(jobDeploymentStatus="ValidationFailed", reason="ValidationFailed",
                      message="The RayJob spec is invalid: BackoffLimit is incompatible with ClusterSelector mode")
        return
    attempt = status.get("failed", 0)
    if deployment in ("Retrying", "Suspending"):
        _delete_cluster(world, job)
        for key in ("rayClusterName", "jobId", "reason", "message", "dashboardURL"):
            status.pop(key, None)
        status.update(jobStatus="", jobDeploymentStatus="" if deployment == "Retrying" else "Suspended")
        fake.update(submitter_done=False, placed_at=None)
    elif deployment == "Suspended":
        if not spec.get("suspend"):
            status.update(jobStatus="", jobDeploymentStatus="")
    elif deployment == "":
        if STOP_FINALIZER not in job["metadata"].setdefault("finalizers", []):
            job["metadata"]["finalizers"].append(STOP_FINALIZER)
        suffix = "abcde" if attempt == 0 else f"retry{attempt}"
        cluster = CLUSTER_SUFFIX if attempt == 0 else f"r{attempt}x7k"
        status.update(jobId=f"{name}-{suffix}", rayClusterName=selected_cluster(job) or f"{name}-{cluster}",
                      jobStatus="", jobDeploymentStatus="Initializing", startTime=kueue_double.timestamp(world.state))
        fake["started_at"] = fake["reconciles"]
        if not spec.get("suspend") and not selected_cluster(job):
            world.cluster_created(job)
        fake["placed_at"] = fake["reconciles"] if not spec.get("suspend") and world.placed(job) else None
    elif deployment == "Initializing":
        pre_running = knobs.get("pre_running_deadline_after")
        if spec.get("suspend"):
            status["jobDeploymentStatus"] = "Suspending"
        elif pre_running is not None and fake["reconciles"] - fake["started_at"] >= pre_running:
            status.update(jobDeploymentStatus="Failed", reason="PreRunningDeadlineExceeded",
                          message="The RayJob has passed the preRunningDeadlineSeconds.")
        elif fake.get("placed_at") is None:
            if world.placed(job):
                fake["placed_at"] = fake["reconciles"]
        elif world.cluster_ready(job):
            status.update(jobDeploymentStatus="Running", dashboardURL=f"{status['rayClusterName']}-head-svc:8265")
            fake["running_since"] = fake["reconciles"]
    elif deployment == "Running" and spec.get("suspend"):
        status["jobDeploymentStatus"] = "Suspending"
    elif deployment == "Running" and knobs.get("deadline_after") is not None \
            and fake["reconciles"] - fake["running_since"] >= knobs["deadline_after"]:
        status.update(jobDeploymentStatus="Failed", reason="DeadlineExceeded",
                      message="The RayJob has passed the activeDeadlineSeconds.")
        fake["ended_at"] = fake["reconciles"]
    elif deployment == "Running":
        _running(world, job, attempt)


def _running(world: World, job: dict, attempt: int) -> None:
    """jobStatus is what the dashboard says of the Ray job: PENDING, then RUNNING, then the
    outcome once the job ended (the submitter's `ray job submit` follows it to its end)."""
    status, fake = job["status"], job["_fake"]
    ray_status, code = status.get("jobStatus") or "", 1
    if world.driver_finished(job):
        if ray_status not in TERMINAL_JOB:
            ray_status, code = world.outcome(job, attempt)
        fake["submitter_done"] = True
    else:
        ray_status = "PENDING" if ray_status == "" else "RUNNING"
    status["jobStatus"] = ray_status
    if ray_status in TERMINAL_JOB and fake["submitter_done"]:
        failed = ray_status == "FAILED"
        fake["ended_at"] = fake["reconciles"]
        status.update(jobDeploymentStatus="Failed" if failed else "Complete", endTime=kueue_double.timestamp(world.state),
                      **({"reason": "AppFailed", "message": f"Job entrypoint command failed with exit code {code}"}
                         if failed else {}))
        if failed:
            status["failed"] = attempt + 1
            if status["failed"] < (job["spec"].get("backoffLimit") or 0) + 1:
                status["jobDeploymentStatus"] = "Retrying"  # same reconcile: Failed is never written


def tick(world: World) -> None:
    """One tick of the controllers: Kueue's pass, then KubeRay's reconcile of every RayJob."""
    state = world.state
    state["now"] = state.get("now", 0) + 1
    kueue_double.reconcile(state)
    for job in list(state["rayjobs"].values()):
        if not world.moves(job):
            continue
        before = (job.get("status") or {}).get("jobDeploymentStatus", "")
        reconcile(world, job)
        if job["status"].get("jobDeploymentStatus", "") != before:
            state.setdefault("history", []).append([state["now"], job["metadata"]["name"],
                                                    job["status"].get("jobDeploymentStatus") or "New"])


def apply_rayjob(state: dict, doc: dict) -> None:
    """Server-side apply of a RayJob: a new one is created (Kueue's webhook on the way); an
    existing one's spec changes and its status stays."""
    old = state["rayjobs"].get(doc["metadata"]["name"])
    if old is not None:
        old["spec"] = doc["spec"]
        return
    kueue_double.on_create(state, doc)
    state["rayjobs"][doc["metadata"]["name"]] = doc


def delete_rayjob(world: World, name: str, foreground: bool) -> dict | None:
    """``kubectl delete rayjob NAME``: the finalizer's StopJob, then the garbage collector (its
    Workload, its own RayCluster). The deleted RayJob; None when there was none.

    With --cascade=foreground the collector deletes the owned cluster while the RayJob waits for
    its dependents, racing KubeRay's finalizer: the double takes the losing order (the head is
    gone before StopJob reaches it, so the job is not stopped). Background (the default): the
    finalizer's StopJob runs before the RayJob goes and the collector deletes the cluster after it
    (rayjob_controller.go:112-138)."""
    state = world.state
    job = state["rayjobs"].pop(name, None)
    if job is None:
        return None
    kueue_double.collect(state)  # its Workload: an owner reference, the garbage collector
    status = job.get("status") or {}
    state.setdefault("deleted_rayjobs", []).append({"name": name, "jobStatus": status.get("jobStatus")})
    cluster = status.get("rayClusterName")
    owned = bool(cluster) and not job["spec"].get("clusterSelector")
    if status.get("jobStatus") not in TERMINAL_JOB and not (owned and foreground):
        state.setdefault("stopped_jobs", []).append(status.get("jobId", ""))
    if owned:
        state.setdefault("deleted_clusters", []).append({"cluster": cluster, "foreground": foreground})
        world.cluster_deleted(job)
    return job


# --- the RayCluster ---------------------------------------------------------------------------

def recreate_hash(spec: dict) -> str:
    """utils/util.go GenerateHashWithoutReplicasAndWorkersToDelete at ray-operator/v1.7.0 (sha1 of
    the JSON, base32hex). Key order differs from Go's struct order; equal specs still hash equal."""
    muted = copy.deepcopy(spec)
    for field in ("tolerations", "schedulingGates"):
        muted["headGroupSpec"]["template"].get("spec", {}).pop(field, None)
    for group in muted.get("workerGroupSpecs") or []:
        for field in ("replicas", "maxReplicas", "minReplicas"):
            group.pop(field, None)
        (group.get("scaleStrategy") or {}).pop("workersToDelete", None)
        for field in ("tolerations", "schedulingGates"):
            group["template"].get("spec", {}).pop(field, None)
    muted.pop("upgradeStrategy", None)
    digest = hashlib.sha1(json.dumps(muted, sort_keys=True, separators=(",", ":")).encode()).digest()
    return base64.b32hexencode(digest).decode()


def pod(name: str, cluster: str, node_type: str, container: str, image: str, spec_hash: str) -> dict:
    return {"metadata": {"name": name, "uid": str(uuid.uuid4()),
                         "labels": {"ray.io/cluster": cluster, "ray.io/node-type": node_type},
                         "annotations": {HASH_KEY: spec_hash}},
            "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}],
                       "containerStatuses": [{"name": container, "image": image, "imageID": "", "ready": False}]}}


def head_image(spec: dict) -> str:
    return spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]


def cluster_pods(name: str, spec: dict) -> list[dict]:
    h = recreate_hash(spec)
    pods = [pod(f"{name}-head-x1", name, "head", "ray-head", head_image(spec), h)]
    for group in spec.get("workerGroupSpecs") or []:
        image = group["template"]["spec"]["containers"][0]["image"]
        pods += [pod(f"{name}-{group['groupName']}-worker-{i}", name, "worker", "ray-worker", image, h)
                 for i in range(int(group.get("replicas", 0)))]
    return pods


def new_cluster(name: str, spec: dict) -> dict:
    """A RayCluster entry of the state: its object (generation 1) and its new pods."""
    return {"object": {"metadata": {"name": name, "generation": 1}, "spec": spec}, "pods": cluster_pods(name, spec)}


def desired_workers(spec: dict) -> int:
    return sum(int(g.get("replicas", 0)) for g in spec.get("workerGroupSpecs") or [])


def reconcile_cluster(cluster: dict, crashloop_image: str = "") -> None:
    """One KubeRay reconcile + kubelet step for a RayCluster entry of the state."""
    terminating = [p for p in cluster["pods"] if p["metadata"].get("deletionTimestamp")]
    if terminating:
        if cluster.pop("terminating_seen", False):  # gone: the new pods are created now
            cluster["pods"] = cluster_pods(cluster["object"]["metadata"]["name"], cluster["object"]["spec"])
        else:
            cluster["terminating_seen"] = True  # still Terminating for this reconcile
    for p in cluster["pods"]:
        if p["status"]["phase"] == "Pending":
            p["status"]["phase"] = "Running"
            for c in p["status"]["containerStatuses"]:
                c["imageID"] = c["image"]  # containerd: the reference the pod was pulled by
            ready = not (crashloop_image and p["metadata"]["labels"]["ray.io/node-type"] == "head"
                         and p["status"]["containerStatuses"][0]["image"].endswith("@" + crashloop_image))
            p["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
            for c in p["status"]["containerStatuses"]:
                c["ready"] = ready
    spec = cluster["object"]["spec"]
    # utils/util.go CheckAllPodsRunning: phase Running and the Ready condition True
    running = all(p["status"]["phase"] == "Running" and p["status"]["conditions"][0]["status"] == "True"
                  for p in cluster["pods"])
    status = dict(cluster["object"].get("status") or {})
    status["observedGeneration"] = cluster["object"]["metadata"]["generation"]
    if len(cluster["pods"]) == desired_workers(spec) + 1 and running:
        status["state"] = "ready"  # calculateStatus never resets it (sticky across a Recreate)
    cluster["object"]["status"] = status


def apply_cluster(clusters: dict, obj: dict) -> bool:
    """Server-side apply of a RayCluster; True when its pods were (re)created."""
    name = obj["metadata"]["name"]
    old = clusters.get(name)
    if old is None:
        obj = {**obj, "metadata": {**obj["metadata"], "generation": 1}}
        clusters[name] = {"object": obj, "pods": cluster_pods(name, obj["spec"])}
        return True
    generation = old["object"]["metadata"]["generation"] + (old["object"]["spec"] != obj["spec"])
    old["object"] = {**obj, "metadata": {**obj["metadata"], "generation": generation},
                     "status": old["object"].get("status", {})}
    recreate = (obj["spec"].get("upgradeStrategy") or {}).get("type") == "Recreate"
    head = next((p for p in old["pods"] if p["metadata"]["labels"]["ray.io/node-type"] == "head"), None)
    actual = head["metadata"]["annotations"].get(HASH_KEY, "") if head else ""
    if recreate and actual and actual != recreate_hash(obj["spec"]):
        for p in old["pods"]:  # deleted: Terminating, still Running and Ready, until the next reconcile
            p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        old.pop("terminating_seen", None)
        return True
    return False


def head_deleted(state: dict, cluster: str) -> list[str]:
    """A Recreate deletes the head: the drivers of the RayJobs running on it die with it. Their names."""
    killed = []
    for name, job in state["rayjobs"].items():
        if selected_cluster(job) == cluster and job["status"].get("jobDeploymentStatus") not in FINISHED:
            job["status"].update(jobStatus="FAILED", jobDeploymentStatus="Failed", reason="AppFailed",
                                 message="the head pod was deleted under the running job")
            killed.append(name)
    return killed
