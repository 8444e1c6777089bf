"""A fake ``kubectl`` for the pipeline tests: it keeps the cluster's objects in a JSON file,
records every apply, and answers the reads the pipeline steps make the way KubeRay v1.7.0 and
containerd would. Each modelled behaviour follows ``ray-project/kuberay`` tag
``ray-operator/v1.7.0``:

- RayCluster Recreate (``ray-operator/controllers/ray/raycluster_controller.go``
  ``shouldRecreatePodsForUpgrade``): pods are recreated only when ``spec.upgradeStrategy.type``
  is ``Recreate`` AND the head pod's ``ray.io/upgrade-strategy-recreate-hash`` annotation differs
  from the spec's hash; the hash is ``utils/util.go`` ``GenerateHashWithoutReplicasAndWorkersToDelete``
  (the whole spec, pod-template labels and annotations included, less workers' replicas /
  min / max / workersToDelete, tolerations and scheduling gates, and upgradeStrategy), ported in
  :func:`recreate_hash`. An unchanged spec, or a change without Recreate, leaves running pods
  (and their image IDs) alone.
- RayCluster status (``raycluster_controller.go`` ``calculateStatus``): ``state: ready`` once
  head + desired workers exist and all are Running and Ready (``utils/util.go``
  ``CheckAllPodsRunning``), and never reset afterwards; ``observedGeneration`` follows the
  generation it reconciled. A Recreate (``reconcilePods``) deletes every pod first: they stay
  Running and Ready with ``metadata.deletionTimestamp`` set (Terminating) for one reconcile, and
  the new pods (new ``uid``) are created in the next one. One reconcile per ``get raycluster``:
  new pods start Pending with no image ID and
  run (Ready, ``imageID`` = the reference they were pulled by, as containerd reports) at the next
  reconcile; a head on the scenario's ``crashloop_image`` (a digest) never becomes Ready.
- RayJob status (``rayjob_controller.go``): deployment ``""`` -> ``Initializing`` (the job's own
  RayCluster is created) -> ``Running`` with job status ``PENDING`` -> ``RUNNING`` -> terminal
  (``SUCCEEDED``/``Complete`` or ``FAILED``/``Failed``), one step per ``get rayjob``. On SUCCEEDED
  the job "runs": the real local training run (``run_source``) is copied to
  ``<storage_path>/<run_name>/`` of its entrypoint, in the (moto) bucket, with its ``run_dir``
  set to that folder (``training/run_record.py`` writes it so). Scenario ``smoke_result``
  ``TRAINED_FAILED``: the run is written, then the job fails (``AppFailed``). A run name whose
  run already exists in the bucket is refused, as the training refuses a finished run
  (``training/checkpointing/restore.py`` plan_resume: ExistingRunError, exit 2): the job
  fails with ``AppFailed`` and writes nothing. Scenario ``smoke_result`` ``NO_CAPACITY``: the
  job's pods stay Pending (unschedulable) and the RayJob fails with ``PreRunningDeadlineExceeded``
  (``rayjob_controller.go`` checkPreRunningDeadlineAndUpdateStatusIfNeeded) without running.
- RayJobs on the long-lived cluster (``spec.clusterSelector["ray.io/cluster"]``, a user's
  ``-on-cluster`` job; the test puts them in ``state.json``): ``get rayjobs`` lists every RayJob
  and advances each such job one poll (``polls_left``; ``None``: it never ends), then it is
  ``SUCCEEDED``/``Complete``. A Recreate of that cluster while one is not terminal kills it (its
  driver runs in the deleted head pod): it ends ``FAILED``/``Failed`` and the apply is logged
  with ``killed``.

- Kueue v0.19.2 in front of the RayJobs, when ``state.json`` holds the add-on's objects
  (``kueue``): the kubectl double's Kueue, reused (tests/raytrain_eks/kueue_double.py: the
  webhook suspends a labelled RayJob at creation, the scheduler admits its Workload against the
  ClusterQueue's quota, higher priority first, and unsuspends it). Each ``get rayjob NAME`` is one
  tick: Kueue's pass, then the reconciles. A suspended RayJob is ``Suspended`` with no cluster
  (``rayjob_controller.go:366-418``; the controller requeues at once, so no poll sees the steps
  between), and starts again from New once unsuspended. A user's GPU job applied with
  ``polls_left`` (no clusterSelector; its own cluster) runs from its admission for that many
  ticks, then is ``SUCCEEDED``/``Complete`` (its Workload then finishes and frees the quota).

State lives in ``$FAKE_KUBE_DIR``: ``state.json``, ``applied.jsonl``, ``scenario.json``.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import re
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the kubectl double's Kueue
import kueue_double  # noqa: E402

ROOT = Path(os.environ["FAKE_KUBE_DIR"])
HASH_KEY = "ray.io/upgrade-strategy-recreate-hash"  # utils/constant.go UpgradeStrategyRecreateHashKey
JOB_STEPS = [("", "Initializing"), ("PENDING", "Running"), ("RUNNING", "Running")]


def load(name: str, default):
    path = ROOT / name
    return json.loads(path.read_text()) if path.is_file() else default


def save(state: dict) -> None:
    (ROOT / "state.json").write_text(json.dumps(state, indent=1))


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


def cluster_pods(name: str, spec: dict) -> list[dict]:
    h = recreate_hash(spec)
    pods = [pod(f"{name}-head-x1", name, "head", "ray-head", head_image(spec), h)]
    for group in spec.get("workerGroupSpecs") or []:
        image = group["template"]["spec"]["containers"][0]["image"]
        pods += [pod(f"{name}-{group['groupName']}-worker-{i}", name, "worker", "ray-worker", image, h)
                 for i in range(int(group.get("replicas", 0)))]
    return pods


def head_image(spec: dict) -> str:
    return spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]


def desired_workers(spec: dict) -> int:
    return sum(int(g.get("replicas", 0)) for g in spec.get("workerGroupSpecs") or [])


def reconcile(cluster: dict, scenario: dict) -> None:
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
            bad = scenario.get("crashloop_image")
            ready = not (bad and p["metadata"]["labels"]["ray.io/node-type"] == "head"
                         and p["status"]["containerStatuses"][0]["image"].endswith("@" + bad))
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


def run_job(job: dict, scenario: dict) -> bool:
    """Write the run into the bucket as the training would; False when the run name already
    holds a run (the training refuses it and writes nothing)."""
    import boto3

    entry = job["spec"]["entrypoint"]
    storage = re.search(r"checkpoint\.storage_path=(\S+)", entry).group(1)
    run = re.search(r"checkpoint\.run_name=(\S+)", entry).group(1)
    bucket, _, prefix = storage.removeprefix("s3://").partition("/")
    s3 = boto3.client("s3")
    if s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/{run}/").get("KeyCount", 0):
        return False
    for path in Path(scenario["run_source"]).iterdir():
        if path.is_file():
            body = path.read_bytes()
            if path.name == "run.json":
                body = json.dumps({**json.loads(body), "run_dir": f"{storage.rstrip('/')}/{run}"}).encode()
            s3.put_object(Bucket=bucket, Key=f"{prefix}/{run}/{path.name}", Body=body)
    return True


def apply_cluster(state: dict, obj: dict) -> bool:
    """Server-side apply of a RayCluster; True when its pods were (re)created."""
    name = obj["metadata"]["name"]
    old = state["clusters"].get(name)
    if old is None:
        obj = {**obj, "metadata": {**obj["metadata"], "generation": 1}}
        state["clusters"][name] = {"object": obj, "pods": cluster_pods(name, obj["spec"])}
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


def apply(state: dict, obj: dict, scenario: dict) -> None:
    kind, name = obj["kind"], obj["metadata"]["name"]
    with open(ROOT / "applied-kinds.txt", "a") as log:
        log.write(f"{kind} {name}\n")
    if kind == "NetworkPolicy":  # a Ray cluster's policy, applied before the cluster
        return
    killed = []
    if kind == "RayCluster":
        recreated = apply_cluster(state, obj)
        if recreated:
            killed = kill_jobs_on(state, name)
    else:
        state["rayjobs"][name] = {**obj, "status": {}}
        kueue_double.on_create(state, state["rayjobs"][name])
        recreated = True
    with open(ROOT / "applied.jsonl", "a") as log:
        spec = obj["spec"] if kind == "RayCluster" else obj["spec"]["rayClusterSpec"]
        log.write(json.dumps({"kind": kind, "name": name, "image": head_image(spec), "recreated": recreated,
                              "upgradeStrategy": obj["spec"].get("upgradeStrategy"), "killed": killed}) + "\n")


def pending_until_deadline(state: dict, name: str, job: dict) -> dict:
    """No GPU node frees up: the pods stay Pending (unschedulable) while the RayJob is
    Initializing; at the third poll KubeRay's preRunningDeadlineSeconds has passed."""
    status = job["status"]
    cluster = f"{name}-k7x2q"
    if "rayClusterName" not in status:
        status.update(rayClusterName=cluster, jobStatus="", jobDeploymentStatus="Initializing", step=0)
        pods = cluster_pods(cluster, job["spec"]["rayClusterSpec"])
        for p in pods:
            p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
        state["clusters"][cluster] = {"object": {"metadata": {"name": cluster, "generation": 1},
                                                 "spec": job["spec"]["rayClusterSpec"]}, "pods": pods}
    elif status["step"] < 2:
        status["step"] += 1
    else:
        status.update(jobStatus="", jobDeploymentStatus="Failed", reason="PreRunningDeadlineExceeded",
                      message="The RayJob has passed the preRunningDeadlineSeconds.")
    return job


def list_rayjobs(state: dict) -> list[dict]:
    """``get rayjobs``: every RayJob; each one on the long-lived cluster advances one poll."""
    for job in state["rayjobs"].values():
        if not (job["spec"].get("clusterSelector") or {}).get("ray.io/cluster"):
            continue
        status = job["status"]
        left = job.get("polls_left")
        if status.get("jobDeploymentStatus") == "Running" and left is not None:
            job["polls_left"] = left - 1
            if left - 1 <= 0:
                status.update(jobStatus="SUCCEEDED", jobDeploymentStatus="Complete")
    return list(state["rayjobs"].values())


def kill_jobs_on(state: dict, cluster: str) -> list[str]:
    """A Recreate deletes the head: the drivers of the jobs running on it die with it."""
    killed = []
    for name, job in state["rayjobs"].items():
        if (job["spec"].get("clusterSelector") or {}).get("ray.io/cluster") == cluster \
                and job["status"].get("jobDeploymentStatus") not in ("Complete", "Failed"):
            job["status"].update(jobStatus="FAILED", jobDeploymentStatus="Failed", reason="AppFailed",
                                 message="the head pod was deleted under the running job")
            killed.append(name)
    return killed


def suspended(state: dict, job: dict) -> bool:
    """KubeRay's suspension (rayjob_controller.go:366-418): a suspended RayJob's cluster is
    deleted and its status cleared to ``Suspended``; unsuspended, it starts again from New."""
    status = job["status"]
    if job["spec"].get("suspend"):
        if status.get("jobDeploymentStatus") != "Suspended":
            state["clusters"].pop(status.get("rayClusterName", ""), None)
            status.clear()
            status.update(jobStatus="", jobDeploymentStatus="Suspended")
        return True
    if status.get("jobDeploymentStatus") == "Suspended":
        status.clear()
    return False


def run_gpu_job(state: dict, job: dict) -> None:
    """A user's GPU job (``polls_left``): Running from its admission, Complete after its polls."""
    status = job["status"]
    if suspended(state, job) or status.get("jobDeploymentStatus") in ("Complete", "Failed"):
        return
    if status.get("jobDeploymentStatus") != "Running":
        status.update(jobStatus="RUNNING", jobDeploymentStatus="Running", rayClusterName=f"{job['metadata']['name']}-g4p7z")
        return
    job["polls_left"] -= 1
    if job["polls_left"] <= 0:
        status.update(jobStatus="SUCCEEDED", jobDeploymentStatus="Complete")


def tick(state: dict, name: str, scenario: dict) -> dict | None:
    """``get rayjob NAME``: Kueue's pass, the users' GPU jobs one poll on, then the job's reconcile."""
    state["now"] = state.get("now", 0) + 1
    kueue_double.reconcile(state)
    for job in state["rayjobs"].values():
        if "polls_left" in job and not (job["spec"].get("clusterSelector") or {}):
            run_gpu_job(state, job)
    job = state["rayjobs"].get(name)
    return job if job is None or "polls_left" in job else step_job(state, name, scenario)


def step_job(state: dict, name: str, scenario: dict) -> dict | None:
    """One rayjob_controller.go reconcile of the job's deployment status."""
    job = state["rayjobs"].get(name)
    if job is None:
        return None
    if suspended(state, job):
        return job
    status = job["status"]
    cluster = f"{name}-k7x2q"
    done = status.get("jobDeploymentStatus") in ("Complete", "Failed")
    if not done and scenario.get("smoke_result") == "NO_CAPACITY":
        return pending_until_deadline(state, name, job)
    if not done:
        index = status.get("step", -1) + 1
        if index == 0:
            status["rayClusterName"] = cluster
            state["clusters"][cluster] = {"object": {"metadata": {"name": cluster, "generation": 1},
                                                     "spec": job["spec"]["rayClusterSpec"]},
                                          "pods": cluster_pods(cluster, job["spec"]["rayClusterSpec"])}
        else:
            reconcile(state["clusters"][cluster], {})
        if index < len(JOB_STEPS):
            status["jobStatus"], status["jobDeploymentStatus"] = JOB_STEPS[index]
            status["step"] = index
        else:
            result = scenario.get("smoke_result", "SUCCEEDED")
            if result in ("SUCCEEDED", "TRAINED_FAILED") and not run_job(job, scenario):
                result = "REFUSED"
            ok = result == "SUCCEEDED"
            status.update(jobStatus="SUCCEEDED" if ok else "FAILED", jobDeploymentStatus="Complete" if ok else "Failed",
                          reason="" if ok else "AppFailed",
                          message="" if ok else f"Job entrypoint command failed with exit code {2 if result == 'REFUSED' else 1}")
    return job


def main(argv: list[str]) -> int:
    state = load("state.json", {"clusters": {}, "rayjobs": {}})
    scenario = load("scenario.json", {})
    if argv[:1] == ["-n"]:
        argv = argv[2:]
    verb, rest = argv[0], argv[1:]
    if verb == "apply":
        apply(state, json.loads(sys.stdin.read()), scenario)
    elif verb == "delete":
        state["rayjobs"].pop(rest[1], None)
        kueue_double.collect(state)  # its Workload: an owner reference, the garbage collector
    elif verb == "get" and rest[0] == "rayjobs":
        print(json.dumps({"items": list_rayjobs(state)}))
    elif verb == "get" and rest[0] == "rayjob":
        job = tick(state, rest[1], scenario)
        print(json.dumps(job) if job else "")
    elif verb == "get" and rest[0] == kueue_double.WORKLOADS:
        if not kueue_double.installed(state):
            print('error: the server doesn\'t have a resource type "workloads"', file=sys.stderr)
            return 1
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": kueue_double.workloads(state)}))
    elif verb == "get" and rest[0] == "raycluster":
        cluster = state["clusters"].get(rest[1])
        if cluster is not None:
            reconcile(cluster, scenario)
        print(json.dumps(cluster["object"]) if cluster else "")
    elif verb == "get" and rest[0] == "pods":
        selector = rest[rest.index("-l") + 1].split("=", 1)[1]
        print(json.dumps({"items": (state["clusters"].get(selector) or {}).get("pods", [])}))
    else:
        print(f"fake kubectl: unsupported: {argv}", file=sys.stderr)
        return 1
    save(state)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
