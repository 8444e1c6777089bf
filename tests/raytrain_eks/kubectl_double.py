#!/usr/bin/env python3
"""A kubectl double for `raytrain-eks submit/status/logs/stop/list`, on the KubeRay v1.7.0
controller of kuberay_double.py (a RayJob moves through the states KubeRay writes, one tick per
``get rayjob NAME``), with the CLI's world around it (:class:`CliWorld`): the GPU nodes' room and
the pods of a cluster that waits for it (node_double.py), the scenario's knobs in the state
(``cluster_ready_after``, ``submitter_runs``, ``pre_running_deadline_after``, ``deadline_after``,
``outcomes``/``outcome``, ``ttl_after``), and the results the job publishes when it ends.

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

import kuberay_double
import kueue_double
from kuberay_double import TERMINAL_JOB, World, visible
from node_double import gpus_fit, pods


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


class CliWorld(World):
    """The CLI tests' world: the GPU node groups' room (node_double.py), the knobs in the state,
    and the results the job publishes at its end."""

    def placed(self, job: dict) -> bool:
        return gpus_fit(self.state, job)

    def outcome(self, job: dict, attempt: int) -> tuple[str, int]:
        publish_results(self.state, job)
        return super().outcome(job, attempt)


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
            if doc["kind"] == "RayJob":
                kuberay_double.apply_rayjob(state, doc)
            elif doc["kind"] == "ServiceAccount":
                state.setdefault("serviceaccounts", {})[doc["metadata"]["name"]] = doc
            else:
                state.setdefault("policies", {})[doc["metadata"]["name"]] = doc
        return 0
    if verb == "get" and rest[0] == "rayjob":
        if len(rest) > 1 and not rest[1].startswith("-"):
            job = state["rayjobs"].get(rest[1])
            if job is None:
                return not_found("rayjobs.ray.io", rest[1])
            kuberay_double.tick(CliWorld(state, state))
            fake = job["_fake"]
            if "stopped_after" in state and (job.get("status") or {}).get("jobDeploymentStatus") == "Running":
                fake["running_gets"] = fake.get("running_gets", 0) + 1
                if fake["running_gets"] > state["stopped_after"]:
                    publish_results(state, job)
                    del state["rayjobs"][rest[1]]
                    return not_found("rayjobs.ray.io", rest[1])
            print(json.dumps(visible(job)))
            return 0
        items = [visible(j) for j in state["rayjobs"].values()]
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
            if kuberay_double.delete_rayjob(CliWorld(state, state), name, "--cascade=foreground" in rest) is None \
                    and "--ignore-not-found" not in rest:
                return not_found("rayjobs.ray.io", name)
            return 0
        if kind == "networkpolicy":
            if state.get("policies", {}).pop(name, None) is None and "--ignore-not-found" not in rest:
                return not_found("networkpolicies.networking.k8s.io", name)
            return 0
    print(f"fake kubectl: unsupported: {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
