"""A fake ``kubectl`` for the pipeline walk-through: it keeps the cluster's objects in a JSON
file, records every apply, and answers the reads the pipeline steps make the way KubeRay v1.7.0
and containerd would:

- a RayCluster applied with ``upgradeStrategy: Recreate`` gets all its pods recreated, reporting
  ``imageID = <the manifest's image>`` (containerd reports the reference the pod was pulled by);
  without it (or with ``stuck_pods`` in the scenario) the running pods keep their old image ID;
- a RayJob gets a cluster of its own (``<name>-<5 chars>``, pods on the RayJob's image) and ends
  with the scenario's ``smoke_result``. On SUCCEEDED it "runs" the job: the run directory of the
  real local training run (``run_source``) is copied to ``<storage_path>/<run_name>/`` of its
  entrypoint, in the (moto) bucket, as Ray Train would have written it.

State lives in ``$FAKE_KUBE_DIR``: ``state.json``, ``applied.jsonl``, ``scenario.json``.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(os.environ["FAKE_KUBE_DIR"])


def load(name: str, default):
    path = ROOT / name
    return json.loads(path.read_text()) if path.is_file() else default


def save(state: dict) -> None:
    (ROOT / "state.json").write_text(json.dumps(state, indent=1))


def pod(name: str, cluster: str, container: str, image_id: str) -> dict:
    return {"metadata": {"name": name, "labels": {"ray.io/cluster": cluster}},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": container, "image": image_id, "imageID": image_id, "ready": True}]}}


def cluster_pods(name: str, spec: dict, image_id: str) -> list[dict]:
    pods = [pod(f"{name}-head-x1", name, "ray-head", image_id)]
    for group in spec.get("workerGroupSpecs") or []:
        pods += [pod(f"{name}-{group['groupName']}-worker-{i}", name, "ray-worker", image_id)
                 for i in range(int(group.get("replicas", 0)))]
    return pods


def head_image(spec: dict) -> str:
    return spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]


def run_job(job: dict, scenario: dict) -> None:
    import boto3

    entry = job["spec"]["entrypoint"]
    storage = re.search(r"checkpoint\.storage_path=(\S+)", entry).group(1)
    run = re.search(r"checkpoint\.run_name=(\S+)", entry).group(1)
    bucket, _, prefix = storage.removeprefix("s3://").partition("/")
    s3 = boto3.client("s3")
    for path in Path(scenario["run_source"]).iterdir():
        if path.is_file():
            s3.upload_file(str(path), bucket, f"{prefix}/{run}/{path.name}")


def apply(state: dict, obj: dict, scenario: dict) -> None:
    kind, name = obj["kind"], obj["metadata"]["name"]
    with open(ROOT / "applied-kinds.txt", "a") as log:
        log.write(f"{kind} {name}\n")
    if kind == "NetworkPolicy":  # a Ray cluster's policy, applied before the cluster
        return
    with open(ROOT / "applied.jsonl", "a") as log:
        spec = obj["spec"] if kind == "RayCluster" else obj["spec"]["rayClusterSpec"]
        log.write(json.dumps({"kind": kind, "name": name, "image": head_image(spec),
                              "upgradeStrategy": obj["spec"].get("upgradeStrategy")}) + "\n")
    if kind == "RayCluster":
        old = state["clusters"].get(name)
        recreate = (obj["spec"].get("upgradeStrategy") or {}).get("type") == "Recreate"
        if old and (not recreate or scenario.get("stuck_pods")):
            return  # KubeRay leaves running pods alone: they report their old image ID
        state["clusters"][name] = cluster_pods(name, obj["spec"], head_image(obj["spec"]))
    elif kind == "RayJob":
        cluster = f"{name}-k7x2q"
        result = scenario.get("smoke_result", "SUCCEEDED")
        state["clusters"][cluster] = cluster_pods(cluster, obj["spec"]["rayClusterSpec"],
                                                  head_image(obj["spec"]["rayClusterSpec"]))
        state["rayjobs"][name] = {**obj, "status": {
            "jobStatus": result, "rayClusterName": cluster,
            "jobDeploymentStatus": "Complete" if result == "SUCCEEDED" else "Failed",
            "reason": "" if result == "SUCCEEDED" else "AppFailed",
            "message": "" if result == "SUCCEEDED" else "Job entrypoint command failed with exit code 1"}}
        if result == "SUCCEEDED":
            run_job(obj, scenario)


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
    elif verb == "get" and rest[0] == "rayjob":
        job = state["rayjobs"].get(rest[1])
        print(json.dumps(job) if job else "")
    elif verb == "get" and rest[0] == "pods":
        selector = rest[rest.index("-l") + 1].split("=", 1)[1]
        print(json.dumps({"items": state["clusters"].get(selector, [])}))
    else:
        print(f"fake kubectl: unsupported: {argv}", file=sys.stderr)
        return 1
    save(state)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
