"""A fake ``kubectl`` for the pipeline tests, on the KubeRay v1.7.0 controller of
tests/raytrain_eks/kuberay_double.py (RayJob and RayCluster, each behaviour cited to
``ray-project/kuberay`` tag ``ray-operator/v1.7.0`` there), with Kueue v0.19.2 in front when
``state.json`` holds the add-on's objects (``kueue``: tests/raytrain_eks/kueue_double.py). It
keeps the cluster's objects in a JSON file, records every apply, and answers the reads the
pipeline steps make. The pipeline's world (:class:`PipelineWorld`):

- RayClusters are objects with pods (``state["clusters"]``): the long-lived one the Apply step
  applies (its Recreate and readiness: kuberay_double.py; one reconcile per ``get raycluster``),
  and each RayJob's own, created Pending and reconciled with its RayJob while it is
  ``Initializing`` (the pods run, with their image IDs, at the next reconcile).
- the smoke job (scenario ``smoke_result``): ``SUCCEEDED``: the job "runs": the real local
  training run (``run_source``) is copied to ``<storage_path>/<run_name>/`` of its entrypoint, in
  the (moto) bucket, with its ``run_dir`` set to that folder (``training/run_record.py`` writes it
  so). ``TRAINED_FAILED``: the run is written, then the job fails (``AppFailed``). ``FAILED``: it
  fails without a run. A run name whose run already exists in the bucket is refused, as the
  training refuses a finished run (``training/checkpointing/restore.py`` plan_resume:
  ExistingRunError, exit 2): the job fails with ``AppFailed`` and writes nothing.
  ``NO_CAPACITY``: no GPU node frees up: the pods stay Pending (Unschedulable) and KubeRay's
  preRunningDeadlineSeconds passes ``NO_CAPACITY_DEADLINE`` reconciles after the start
  (``PreRunningDeadlineExceeded``) without running.
- a user's RayJob with ``polls_left`` ends ``SUCCEEDED`` after that many reconciles in Running
  (``None``: it never ends): a GPU job with its own cluster (walk_env.py ``submit_gpu_job``),
  reconciled every tick like the smoke; or a job on the long-lived cluster
  (``spec.clusterSelector["ray.io/cluster"]``, walk_env.py ``start_cluster_job``), which moves one
  reconcile per ``get rayjobs`` (the Apply step's polls). A Recreate of that cluster while one is
  not terminal kills it (its driver runs in the deleted head pod): the apply is logged with
  ``killed``.

Each ``get rayjob NAME`` is one tick: Kueue's pass, then KubeRay's reconciles.
State lives in ``$FAKE_KUBE_DIR``: ``state.json``, ``applied.jsonl``, ``scenario.json``.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the doubles of KubeRay and Kueue
import kueue_double  # noqa: E402
from kuberay_double import (  # noqa: E402
    World, apply_cluster, apply_rayjob, delete_rayjob, head_deleted, head_image, new_cluster, reconcile,
    reconcile_cluster, selected_cluster, tick, visible,
)

NO_CAPACITY_DEADLINE = 3
"""Reconciles from the smoke's start to its preRunningDeadlineSeconds when no GPU node frees up."""
SUBMITTER_RUNS = 2
"""Reconciles the smoke's submitter follows the Ray job (PENDING, RUNNING) before it ends."""


def root() -> Path:
    return Path(os.environ["FAKE_KUBE_DIR"])


def load(name: str, default):
    path = root() / name
    return json.loads(path.read_text()) if path.is_file() else default


def save(state: dict) -> None:
    (root() / "state.json").write_text(json.dumps(state, indent=1))


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


class PipelineWorld(World):
    """The pipeline tests' world: RayClusters with pods, the smoke's scenario, users' jobs."""

    def __init__(self, state: dict, scenario: dict) -> None:
        self.no_capacity = scenario.get("smoke_result") == "NO_CAPACITY"
        super().__init__(state, {"submitter_runs": SUBMITTER_RUNS,
                                 "pre_running_deadline_after": NO_CAPACITY_DEADLINE if self.no_capacity else None})
        self.scenario = scenario

    def moves(self, job: dict) -> bool:
        return not selected_cluster(job)  # the long-lived cluster's jobs move on `get rayjobs`

    def placed(self, job: dict) -> bool:
        return not self.no_capacity or "polls_left" in job

    def cluster_created(self, job: dict) -> None:
        name = job["status"]["rayClusterName"]
        cluster = new_cluster(name, job["spec"]["rayClusterSpec"])
        if not self.placed(job):
            for p in cluster["pods"]:
                p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
        self.state["clusters"][name] = cluster

    def cluster_deleted(self, job: dict) -> None:
        self.state["clusters"].pop(job["status"]["rayClusterName"], None)

    def cluster_ready(self, job: dict) -> bool:
        cluster = self.state["clusters"][job["status"]["rayClusterName"]]
        reconcile_cluster(cluster)
        return cluster["object"]["status"].get("state") == "ready"

    def driver_finished(self, job: dict) -> bool:
        if "polls_left" not in job:
            return super().driver_finished(job)
        left = job["polls_left"]
        if left is None:
            return False
        job["polls_left"] = left - 1
        return left - 1 <= 0

    def outcome(self, job: dict, attempt: int) -> tuple[str, int]:
        if "polls_left" in job:
            return "SUCCEEDED", 0
        result = self.scenario.get("smoke_result", "SUCCEEDED")
        if result in ("SUCCEEDED", "TRAINED_FAILED") and not run_job(job, self.scenario):
            return "FAILED", 2  # ExistingRunError
        return ("SUCCEEDED", 0) if result == "SUCCEEDED" else ("FAILED", 1)


def apply(state: dict, obj: dict) -> None:
    kind, name = obj["kind"], obj["metadata"]["name"]
    with open(root() / "applied-kinds.txt", "a") as log:
        log.write(f"{kind} {name}\n")
    if kind == "NetworkPolicy":  # a Ray cluster's policy, applied before the cluster
        return
    killed = []
    if kind == "RayCluster":
        recreated = apply_cluster(state["clusters"], obj)
        if recreated:
            killed = head_deleted(state, name)
    else:
        apply_rayjob(state, obj)
        recreated = True
    with open(root() / "applied.jsonl", "a") as log:
        spec = obj["spec"] if kind == "RayCluster" else obj["spec"]["rayClusterSpec"]
        log.write(json.dumps({"kind": kind, "name": name, "image": head_image(spec), "recreated": recreated,
                              "upgradeStrategy": obj["spec"].get("upgradeStrategy"), "killed": killed}) + "\n")


def main(argv: list[str]) -> int:
    state = load("state.json", {"clusters": {}, "rayjobs": {}})
    world = PipelineWorld(state, load("scenario.json", {}))
    if argv[:1] == ["-n"]:
        argv = argv[2:]
    verb, rest = argv[0], argv[1:]
    if verb == "apply":
        apply(state, json.loads(sys.stdin.read()))
    elif verb == "delete":
        delete_rayjob(world, rest[1], "--cascade=foreground" in rest)
    elif verb == "get" and rest[0] == "rayjobs":
        for job in state["rayjobs"].values():
            if not world.moves(job):
                reconcile(world, job)
        print(json.dumps({"items": [visible(j) for j in state["rayjobs"].values()]}))
    elif verb == "get" and rest[0] == "rayjob":
        tick(world)
        job = state["rayjobs"].get(rest[1])
        print(json.dumps(visible(job)) if job else "")
    elif verb == "get" and rest[0] == kueue_double.WORKLOADS:
        if not kueue_double.installed(state):
            print('error: the server doesn\'t have a resource type "workloads"', file=sys.stderr)
            return 1
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": kueue_double.workloads(state)}))
    elif verb == "get" and rest[0] == "raycluster":
        cluster = state["clusters"].get(rest[1])
        if cluster is not None:
            reconcile_cluster(cluster, world.scenario.get("crashloop_image", ""))
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
