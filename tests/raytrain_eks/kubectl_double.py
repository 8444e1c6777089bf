#!/usr/bin/env python3
"""A kubectl double for `raytrain-eks submit/status/logs/stop/list`, with a KubeRay controller
that moves a RayJob through the states KubeRay v1.7.0 writes, one reconcile per `get`.

Modelled on ``ray-project/kuberay`` tag ``ray-operator/v1.7.0``:
``ray-operator/controllers/ray/rayjob_controller.go`` (Reconcile's switch on
``status.jobDeploymentStatus``) and ``ray-operator/apis/ray/v1/rayjob_types.go``:

- ``""`` (New): the controller adds its stop-job finalizer and initialises the status
  (initRayJobStatusIfNeed :887-917): ``jobId``, ``rayClusterName`` (``<name>-<5 chars>``, or the
  clusterSelector's cluster), ``jobStatus = ""``, ``startTime`` (both deadlines count from it);
  -> ``Initializing``.
- ``Initializing``: with ``spec.suspend`` -> ``Suspending`` first (:180-182); then
  ``preRunningDeadlineSeconds`` (``pre_running_deadline_after`` reconciles since ``startTime``):
  ``Failed`` with ``reason = PreRunningDeadlineExceeded`` (:1247-1262); else it stays while the
  RayCluster is not ``ready``: its pods wait for room on the GPU nodes (node_double.py), then
  ``cluster_ready_after`` reconciles (Unschedulable while a node scales up, then
  ContainerCreating); then, in K8sJobMode, creates the submitter Job; -> ``Running``.
- suspension (:366-418, 1043-1060): ``Suspending`` deletes the cluster and clears
  ``rayClusterName``, ``jobId``, ``jobStatus`` -> ``Suspended``, which stays while
  ``spec.suspend`` is true and goes back to New when it is false (a new ``startTime``: time spent
  suspended counts against no deadline). The controller requeues at once after each status
  update, so a suspended RayJob is ``Suspended`` by the first poll. Kueue (kueue_double.py)
  suspends a labelled RayJob at creation and unsuspends it when admitted.
- time: each ``get rayjob NAME`` is one tick: Kueue's pass, then one KubeRay reconcile of EVERY
  RayJob (``now`` counts the ticks; ``history`` records each status a RayJob took, with its tick).
- ``Running``: ``jobStatus`` is the dashboard's (PENDING, then RUNNING). Terminal only when the
  Ray job is terminal AND the submitter has finished (K8sJobMode, kuberay PR 1919): then
  ``Complete`` (SUCCEEDED/STOPPED) or ``Failed`` with ``reason = AppFailed`` (FAILED), and
  ``endTime``.
- validation, before the switch on every reconcile (rayjob_controller.go:144-161): a spec
  KubeRay refuses goes ``ValidationFailed`` with ``reason = ValidationFailed`` and the error as
  ``message``; modelled: ``backoffLimit > 0`` with a ``clusterSelector`` (utils/validation.go:575-576).
- retries: a ``Failed`` RayJob with ``status.failed < backoffLimit + 1`` (reason not
  ``DeadlineExceeded``) becomes ``Retrying`` in the same reconcile, so ``Failed`` is never seen
  then (rayjob_controller.go:452, 518-556); ``Retrying`` deletes the cluster and the submitter,
  clears ``rayClusterName``, ``jobId``, ``jobStatus``, ``reason``, ``message`` and goes back to
  New (rayjob_controller.go:366-410): the next attempt has a new cluster and a new Ray job.
  ``outcomes`` (one per attempt) scripts the attempts; ``outcome`` the rest.
- ``kubectl apply --server-side`` of a RayJob that exists succeeds (exit 0): it changes the
  spec and keeps the status, and a ``Complete``/``Failed`` RayJob is not run again
  (rayjob_controller.go:420-447 only cleans up).
- ``activeDeadlineSeconds`` (``deadline_after``: reconciles in Running): the Running case checks
  it first (rayjob_controller.go:249-257, ``checkActiveDeadlineAndUpdateStatusIfNeeded``
  :1234-1246): ``Failed`` with ``reason = DeadlineExceeded``; ``jobStatus`` keeps the last value
  (RUNNING): the Ray job is not stopped.
- delete: a RayJob whose jobStatus is not terminal gets StopJob on its Ray job first (the
  finalizer, rayjob_controller.go:112-137); the double records the stopped job id, except under
  ``--cascade=foreground`` when the RayJob owns its cluster (the collector deletes it first).
- ``kubectl exec svc/<cluster>-head-svc -c ray-head -- ray job stop --address A ID``: Ray 2.58's
  CLI asks the supervisor to stop the job and returns once it is terminal
  (``dashboard/modules/job/cli.py:448-466``): the double sets ``jobStatus = STOPPED`` at once
  and records the id in ``ray_stopped_jobs``; every RayJob deletion records the jobStatus it had
  (``deleted_rayjobs``), so a test sees whether the Ray job was terminal before the delete.

The submitter's log (``kubectl logs -f job/NAME``) prints the scripted driver log, behind
``submit_preamble`` on the first pod only (with ``submitter_restarts``, the first streams end
half-way, as when the submitter's pod dies and its Job starts a new one that prints the log from
the start; with ``stream_drops``, kubectl's first streams exit 1 half-way); the submitter
finishes when it has been streamed (or after ``submitter_runs`` reconciles in RUNNING). When the
Ray job ends the double copies the scripted results into the run's storage, as the job does.
``kubectl config view --minify -o json`` answers the current context's cluster entry
(``context_cluster``; none: kubectl's "current-context must exist in order to minify").
``kubectl get workloads.kueue.x-k8s.io -o json``: Kueue's Workloads (kueue_double.py); without
Kueue, kubectl's "the server doesn't have a resource type".
``unreachable``: every other call fails as kubectl does when no API server answers.
``forbidden``: every other call is refused as by RBAC: kubectl prints the API server's Status as
"Error from server (Forbidden): ..." (kubernetes/kubectl pkg/cmd/util/helpers.go
StandardErrorMessage; the message text of k8s.io/apiserver's authorization Forbidden) and exits 1.
``stopped_after``: that many ``get rayjob NAME`` reconciles in Running, then the RayJob is gone,
as if `raytrain-eks stop` ran in another terminal (the stopped job writes its results first).
State: the JSON file ``$FAKE_KUBECTL_STATE``; every call is appended to its ``calls``.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

import kueue_double
from node_double import gpus_fit, pods

TERMINAL_JOB = ("SUCCEEDED", "FAILED", "STOPPED")


def load() -> dict:
    return json.loads(Path(os.environ["FAKE_KUBECTL_STATE"]).read_text())


def save(state: dict) -> None:
    Path(os.environ["FAKE_KUBECTL_STATE"]).write_text(json.dumps(state, indent=1))


def not_found(kind: str, name: str) -> int:
    print(f'Error from server (NotFound): {kind} "{name}" not found', file=sys.stderr)
    return 1


def publish_results(state: dict, job: dict) -> None:
    """What the job itself does at its end: run.json, metrics, logs and model in storage."""
    import boto3

    source = state.get("results_dir")
    if not source:
        return
    # the job writes under its run name (checkpoint.run_name in the entrypoint), which is not the
    # RayJob's name for a job on the long-lived cluster (<run>-on-cluster)
    entry = job["spec"].get("entrypoint", "")
    run = entry.split("checkpoint.run_name=")[1].split()[0] if "checkpoint.run_name=" in entry else job["metadata"]["name"]
    bucket, _, prefix = state["run_uri"].format(run=run).removeprefix("s3://").partition("/")
    client = boto3.client("s3")
    for path in Path(source).rglob("*"):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(source).as_posix()}")


def reconcile(state: dict, job: dict) -> None:
    status = job.setdefault("status", {})
    fake = job.setdefault("_fake", {"reconciles": 0, "submitter_done": False})
    fake["reconciles"] += 1
    step(state, job)
    # KubeRay requeues at once after each status update: a suspended RayJob passes
    # New -> Initializing -> Suspending -> Suspended before anyone polls (rayjob_controller.go:165-181, 366-418)
    while job["spec"].get("suspend") and status.get("jobDeploymentStatus") in ("Initializing", "Suspending"):
        step(state, job)


def step(state: dict, job: dict) -> None:
    status, fake = job["status"], job["_fake"]
    deployment = status.get("jobDeploymentStatus", "")
    name = job["metadata"]["name"]
    spec = job["spec"]
    if deployment in ("Complete", "Failed", "ValidationFailed"):
        return
    if spec.get("clusterSelector") and (spec.get("backoffLimit") or 0) > 0:
        status.update(jobDeploymentStatus="ValidationFailed", reason="ValidationFailed",
                      message="The RayJob spec is invalid: BackoffLimit is incompatible with ClusterSelector mode")
        return
    attempt = status.get("failed", 0)
    if deployment in ("Retrying", "Suspending"):
        for key in ("rayClusterName", "jobId", "reason", "message", "dashboardURL"):
            status.pop(key, None)
        status.update(jobStatus="", jobDeploymentStatus="" if deployment == "Retrying" else "Suspended")
        fake.update(submitter_done=False, placed_at=None)
    elif deployment == "Suspended":
        if not spec.get("suspend"):
            status.update(jobStatus="", jobDeploymentStatus="")
    elif deployment == "":
        if "ray.io/rayjob-stopjob-finalizer" not in job["metadata"].setdefault("finalizers", []):
            job["metadata"]["finalizers"].append("ray.io/rayjob-stopjob-finalizer")
        selector = (spec.get("clusterSelector") or {}).get("ray.io/cluster")
        suffix = "abcde" if attempt == 0 else f"retry{attempt}"
        cluster = "x7k2p" if attempt == 0 else f"r{attempt}x7k"
        status.update(jobId=f"{name}-{suffix}", rayClusterName=selector or f"{name}-{cluster}", jobStatus="",
                      jobDeploymentStatus="Initializing", startTime=kueue_double.timestamp(state))
        fake["started_at"] = fake["reconciles"]
        fake["placed_at"] = fake["reconciles"] if not spec.get("suspend") and gpus_fit(state, job) else None
    elif deployment == "Initializing":
        pre_running = state.get("pre_running_deadline_after")
        if spec.get("suspend"):
            status["jobDeploymentStatus"] = "Suspending"
        elif pre_running is not None and fake["reconciles"] - fake["started_at"] >= pre_running:
            status.update(jobDeploymentStatus="Failed", reason="PreRunningDeadlineExceeded",
                          message="The RayJob has passed the preRunningDeadlineSeconds.")
        elif fake.get("placed_at") is None:
            if gpus_fit(state, job):
                fake["placed_at"] = fake["reconciles"]
        elif fake["reconciles"] - fake["placed_at"] >= state["cluster_ready_after"]:
            status.update(jobDeploymentStatus="Running", dashboardURL=f"{status['rayClusterName']}-head-svc:8265")
            fake["running_since"] = fake["reconciles"]
    elif deployment == "Running" and spec.get("suspend"):
        status["jobDeploymentStatus"] = "Suspending"
    elif deployment == "Running" and state.get("deadline_after") is not None \
            and fake["reconciles"] - fake["running_since"] >= state["deadline_after"]:
        status.update(jobDeploymentStatus="Failed", reason="DeadlineExceeded",
                      message="The RayJob has passed the activeDeadlineSeconds.")
        fake["ended_at"] = fake["reconciles"]
    elif deployment == "Running":
        # jobStatus is what the dashboard says of the Ray job: PENDING, then RUNNING, then the
        # outcome once the job ended (the submitter's `ray job submit` follows it to its end).
        ray_status = status.get("jobStatus") or ""
        if fake["submitter_done"] or fake["reconciles"] - fake["running_since"] > state["submitter_runs"]:
            if ray_status not in TERMINAL_JOB:
                outcomes = state.get("outcomes") or []
                ray_status = outcomes[attempt] if attempt < len(outcomes) else state["outcome"]
                publish_results(state, job)
            fake["submitter_done"] = True
        else:
            ray_status = "PENDING" if ray_status == "" else "RUNNING"
        status["jobStatus"] = ray_status
        if ray_status in TERMINAL_JOB and fake["submitter_done"]:
            failed = ray_status == "FAILED"
            fake["ended_at"] = fake["reconciles"]
            status.update(jobDeploymentStatus="Failed" if failed else "Complete", endTime=kueue_double.timestamp(state),
                          **({"reason": "AppFailed", "message": "Job entrypoint command failed with exit code 1"}
                             if failed else {}))
            if failed:
                status["failed"] = attempt + 1
                if status["failed"] < (spec.get("backoffLimit") or 0) + 1:
                    status["jobDeploymentStatus"] = "Retrying"  # same reconcile: Failed is never written


def main(argv: list[str]) -> int:
    state = load()
    state.setdefault("calls", []).append(argv)
    try:
        return dispatch(state, argv)
    finally:
        save(state)


def _opt(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv else ""


def dispatch(state: dict, argv: list[str]) -> int:
    verb, rest = argv[0], argv[1:]
    if state.get("unreachable") and verb != "config":
        # kubectl with no API server to talk to (a destroyed cluster, a stale kubeconfig)
        print("The connection to the server localhost:8080 was refused - did you specify the right host or port?",
              file=sys.stderr)
        return 1
    if state.get("forbidden") and verb != "config":
        print(f'Error from server (Forbidden): rayjobs.ray.io is forbidden: User "arn:aws:iam::111122223333:user/dev" '
              f'cannot {verb} resource "rayjobs" in API group "ray.io" in the namespace "ray"', file=sys.stderr)
        return 1
    if verb == "apply":
        assert "--server-side" in rest, "the KubeRay CRDs need server-side apply"
        for doc in yaml.safe_load_all(Path(_opt(rest, "-f")).read_text()):
            if not doc:
                continue
            store = state["rayjobs"] if doc["kind"] == "RayJob" else state.setdefault("policies", {})
            old = store.get(doc["metadata"]["name"])
            if doc["kind"] == "RayJob" and old is not None:
                # server-side apply of an existing object: the spec changes, the status stays
                old["spec"] = doc["spec"]
                continue
            if doc["kind"] == "RayJob":
                kueue_double.on_create(state, doc)
            store[doc["metadata"]["name"]] = doc
        return 0
    if verb == "get" and rest[0] == "rayjob":
        if len(rest) > 1 and not rest[1].startswith("-"):
            job = state["rayjobs"].get(rest[1])
            if job is None:
                return not_found("rayjobs.ray.io", rest[1])
            # one tick of the controllers: Kueue's, then KubeRay's for every RayJob
            state["now"] = state.get("now", 0) + 1
            kueue_double.reconcile(state)
            for each in list(state["rayjobs"].values()):
                before = (each.get("status") or {}).get("jobDeploymentStatus", "")
                reconcile(state, each)
                if each["status"].get("jobDeploymentStatus", "") != before:
                    state.setdefault("history", []).append([state["now"], each["metadata"]["name"],
                                                            each["status"].get("jobDeploymentStatus") or "New"])
            fake = job["_fake"]
            if "stopped_after" in state and (job.get("status") or {}).get("jobDeploymentStatus") == "Running":
                fake["running_gets"] = fake.get("running_gets", 0) + 1
                if fake["running_gets"] > state["stopped_after"]:
                    publish_results(state, job)
                    del state["rayjobs"][rest[1]]
                    return not_found("rayjobs.ray.io", rest[1])
            print(json.dumps({k: v for k, v in job.items() if k != "_fake"}))
            return 0
        items = [{k: v for k, v in j.items() if k != "_fake"} for j in state["rayjobs"].values()]
        print(json.dumps({"items": items}))
        return 0
    if verb == "get" and rest[0] == kueue_double.WORKLOADS:
        if not kueue_double.installed(state):
            print('error: the server doesn\'t have a resource type "workloads"', file=sys.stderr)
            return 1
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": kueue_double.workloads(state)}))
        return 0
    if verb == "get" and rest[0] == "networkpolicy":
        return 0 if rest[1] in state.get("policies", {}) else not_found("networkpolicies.networking.k8s.io", rest[1])
    if verb == "get" and rest[0] == "pods":
        print(json.dumps({"items": pods(state, _opt(rest, "-l").removeprefix("ray.io/cluster="))}))
        return 0
    if verb == "logs":
        name = next(a for a in rest if a.startswith("job/")).removeprefix("job/")
        job = state["rayjobs"].get(name)
        if job is None or job.get("status", {}).get("jobDeploymentStatus") not in ("Running", "Complete", "Failed"):
            print(f'error: pods for job "{name}" not found', file=sys.stderr)
            return 1
        log = state.get("driver_log", "")
        restarts = state.get("submitter_restarts", 0)
        fake = job["_fake"]
        # The first submitter pod prints `ray job submit`'s lines before the log; a retried pod
        # finds the job (`ray job status` to /dev/null) and only follows it (common/job.go:119-130).
        preamble = "".join(f"{line}\n" for line in state.get("submit_preamble", [])) \
            if fake.get("submitter_failures", 0) == 0 else ""
        lines = log.splitlines(keepends=True)
        if "-f" in rest and fake.get("stream_drops", 0) < state.get("stream_drops", 0):
            # the connection drops half-way (kubectl exits 1); the same pod's log is read again
            fake["stream_drops"] = fake.get("stream_drops", 0) + 1
            sys.stdout.write(preamble + "".join(lines[:len(lines) // 2]))
            return 1
        if "-f" in rest and fake.get("submitter_failures", 0) < restarts:
            # the submitter's container dies half-way (kubectl still exits 0); its Job starts a
            # new pod whose `ray job logs --follow` prints the log from the start (common/job.go:119-130)
            fake["submitter_failures"] = fake.get("submitter_failures", 0) + 1
            sys.stdout.write(preamble + "".join(lines[:len(lines) // 2]))
            return 0
        sys.stdout.write(preamble + log)
        if "-f" in rest:  # following ends when the submitter's container exits
            job["_fake"]["submitter_done"] = True
        return 0
    if verb == "config" and rest[:2] == ["view", "--minify"]:
        # kubectl 1.3x: with no current context, `config view --minify` fails with this line
        if not state.get("context_cluster"):
            print("error: current-context must exist in order to minify", file=sys.stderr)
            return 1
        print(json.dumps({"kind": "Config", "current-context": "ctx",
                          "contexts": [{"name": "ctx", "context": {"cluster": state["context_cluster"]}}]}))
        return 0
    if verb == "exec":
        # `kubectl exec svc/<cluster>-head-svc -c ray-head -- ray job stop --address A ID`: Ray's
        # CLI stops the job and polls until it is terminal (ray 2.58 dashboard/modules/job/cli.py:448-466)
        target, command = rest[0], rest[rest.index("--") + 1:]
        jobs = [j for j in state["rayjobs"].values() if f"svc/{(j.get('status') or {}).get('rayClusterName')}-head-svc" == target]
        if not jobs:
            print(f'Error from server (NotFound): services "{target[4:]}" not found', file=sys.stderr)
            return 1
        if command[:3] == ["ray", "job", "stop"] and "--no-wait" not in command:
            job = next((j for j in jobs if j["status"].get("jobId") == command[-1]), None)
            if job is None:
                print(f"RuntimeError: Job {command[-1]} does not exist", file=sys.stderr)
                return 1
            if job["status"].get("jobStatus") not in TERMINAL_JOB:
                job["status"]["jobStatus"] = "STOPPED"
            state.setdefault("ray_stopped_jobs", []).append(command[-1])
            print(f"Job '{command[-1]}' was stopped")
            return 0
    if verb == "delete":
        kind, name = rest[0], rest[1]
        if kind == "rayjob":
            job = state["rayjobs"].pop(name, None)
            if job is None:
                return not_found("rayjobs.ray.io", name)
            kueue_double.collect(state)  # its Workload: an owner reference, the garbage collector
            state.setdefault("deleted_rayjobs", []).append({"name": name, "jobStatus": (job.get("status") or {}).get("jobStatus")})
            # its own RayCluster is a controller reference of the RayJob (rayjob_controller.go:1021):
            # the garbage collector deletes it; a clusterSelector cluster is not owned and stays.
            # With --cascade=foreground the collector deletes the owned cluster while the RayJob
            # waits for its dependents, racing KubeRay's finalizer: the double takes the losing
            # order (the head is gone before StopJob reaches it, so the job is not stopped).
            # Background (the default): the finalizer's StopJob runs before the RayJob goes and
            # the collector deletes the cluster after it (rayjob_controller.go:112-138).
            cluster = (job.get("status") or {}).get("rayClusterName")
            owned = bool(cluster) and not job["spec"].get("clusterSelector")
            foreground = "--cascade=foreground" in rest
            if (job.get("status") or {}).get("jobStatus") not in TERMINAL_JOB and not (owned and foreground):
                state.setdefault("stopped_jobs", []).append(job.get("status", {}).get("jobId", ""))
            if owned:
                state.setdefault("deleted_clusters", []).append({"cluster": cluster, "foreground": foreground})
            return 0
        if kind == "networkpolicy":
            if state.get("policies", {}).pop(name, None) is None and "--ignore-not-found" not in rest:
                return not_found("networkpolicies.networking.k8s.io", name)
            return 0
    print(f"fake kubectl: unsupported: {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
