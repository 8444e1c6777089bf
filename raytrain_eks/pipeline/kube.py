"""kubectl, as the pipeline uses it: server-side apply, JSON reads, and the wait for the image
IDs the pods REPORT (``status.containerStatuses[].imageID``: what the runtime actually pulled).

containerd reports ``repo@sha256:<digest>`` (the digest the pod was pulled by: the index digest
for a multi-arch image); dockershim prefixed it with ``docker-pullable://``. Both end in
``@<digest>``, which is what is compared.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from environment.contract import RAY_CLUSTER_LABEL

FIELD_MANAGER = "raytrain-pipeline"


class KubeError(RuntimeError):
    """kubectl failed or the cluster did not reach the wanted state; one line."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Kubectl:
    namespace: str
    binary: str = "kubectl"

    def run(self, *args: str, stdin: str | None = None) -> str:
        command = [self.binary, "-n", self.namespace, *args]
        done = subprocess.run(command, input=stdin, capture_output=True, text=True)
        if done.returncode != 0:
            raise KubeError(f"{' '.join(command[:5])} ... failed: {done.stderr.strip()[-300:]}")
        return done.stdout

    def apply(self, manifest: dict[str, Any]) -> None:
        # The KubeRay CRDs are too large for client-side apply (its last-applied annotation).
        self.run("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "--force-conflicts", "-f", "-",
                 stdin=json.dumps(manifest))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        out = self.run("get", kind, name, "--ignore-not-found", "-o", "json")
        return json.loads(out) if out.strip() else None

    def delete(self, kind: str, name: str) -> None:
        self.run("delete", kind, name, "--ignore-not-found", "--wait=true")

    def cluster_pods(self, cluster: str) -> list[dict[str, Any]]:
        return json.loads(self.run("get", "pods", "-l", f"{RAY_CLUSTER_LABEL}={cluster}", "-o", "json"))["items"]


def image_ids(pods: list[dict[str, Any]], repository: str) -> dict[str, str]:
    """``{pod/container: imageID}`` of the containers running an image of ``repository`` (a
    sidecar of another image is not the training image). ``""`` while not yet pulled."""
    out = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        for status in pod.get("status", {}).get("containerStatuses") or []:
            if repository in status.get("image", "") or repository in status.get("imageID", ""):
                out[f"{name}/{status['name']}"] = status.get("imageID") or ""
    return out


def runs_digest(image_id: str, digest: str) -> bool:
    return bool(image_id) and image_id.endswith("@" + digest)


def expected_pods(cluster: dict[str, Any]) -> int:
    """Head + every worker group's replicas, as the RayCluster manifest asks."""
    groups = cluster["spec"].get("workerGroupSpecs") or []
    return 1 + sum(int(g.get("replicas", g.get("minReplicas", 0)) or 0) for g in groups)


def wait_for_image(kube: Kubectl, cluster: dict[str, Any], *, repository: str, digest: str, timeout_s: float,
                   poll_s: float, clock: Callable[[], float] = time.monotonic) -> dict[str, str]:
    """Wait until the cluster has exactly its expected pods and EVERY one reports ``digest``;
    returns the image IDs. KubeError (with what the pods report) on timeout."""
    name, want = cluster["metadata"]["name"], expected_pods(cluster)
    deadline = clock() + timeout_s
    while True:
        ids = image_ids(kube.cluster_pods(name), repository)
        pods = {key.split("/")[0] for key in ids}
        if len(pods) == want and all(runs_digest(i, digest) for i in ids.values()):
            log(f"apply: all {want} pods of {name} run @{digest}")
            return ids
        if clock() >= deadline:
            stale = sorted({i or "(not pulled)" for i in ids.values() if not runs_digest(i, digest)})
            raise KubeError(f"RayCluster {name}: {len(pods)}/{want} pods, not all on @{digest} after "
                            f"{timeout_s:g} s (they report: {', '.join(stale) or 'nothing'})")
        time.sleep(poll_s)
