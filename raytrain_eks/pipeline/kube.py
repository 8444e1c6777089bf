"""kubectl, as the pipeline uses it: server-side apply, JSON reads, and the wait until the
RayCluster is ready with every pod Ready on the image ID it REPORTS
(``status.containerStatuses[].imageID``: what the runtime actually pulled).

containerd reports ``repo@sha256:<digest>`` (the digest the pod was pulled by: the index digest
for a multi-arch image); dockershim prefixed it with ``docker-pullable://``. Both end in
``@<digest>``, which is what is compared.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from environment.contract import RAY_CLUSTER_LABEL

FIELD_MANAGER = "raytrain-pipeline"
APPLIED_ANNOTATION = "raytrain.io/applied-manifest"
"""On the RayCluster object (metadata, not the spec: KubeRay's Recreate hash covers only the
spec), the hash of the manifest the pipeline applied: tells a rollback whether the live cluster
is still on the promoted manifest."""
READY_STATE = "ready"
"""KubeRay v1.7.0 ``rayv1.Ready``: set by raycluster_controller.go calculateStatus when the
cluster has its desired pods (head + DesiredWorkerReplicas, autoscaled ones included) all
Running and Ready (utils/util.go CheckAllPodsRunning). It is never reset: after a Recreate the
old ``ready`` stays while the new pods start, so the pods themselves are checked too."""


REQUEST_TIMEOUT_S = 60
"""kubectl's ``--request-timeout`` on every call (https://kubernetes.io/docs/reference/kubectl/kubectl/,
global options: "The length of time to wait before giving up on a single server request"), so an API server that stops
answering ends the step with a recorded failure and a rollback, not at the build's timeout."""
DELETE_TIMEOUT_S = 300
"""``kubectl delete --wait --timeout``: how long a delete waits for the object to be gone, e.g.
behind a finalizer that never finishes (https://kubernetes.io/docs/reference/kubectl/generated/kubectl_delete/:
"The length of time to wait before giving up on a delete")."""


class KubeError(RuntimeError):
    """kubectl failed or the cluster did not reach the wanted state; one line."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Kubectl:
    namespace: str
    binary: str = "kubectl"
    request_timeout_s: float = REQUEST_TIMEOUT_S
    margin_s: float = 30
    """What the process may take beyond its requests' and waits' bounds (start-up, auth plugin)."""

    def run(self, *args: str, stdin: str | None = None, wait_s: float = 0) -> str:
        """One kubectl call, bounded: ``--request-timeout`` per server request, and the process
        itself to that plus ``wait_s`` (what the call waits for on purpose) plus a margin."""
        command = [self.binary, "-n", self.namespace, *args, f"--request-timeout={self.request_timeout_s:g}s"]
        bound = self.request_timeout_s + wait_s + self.margin_s
        try:
            done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=bound)
        except subprocess.TimeoutExpired:
            raise KubeError(f"{' '.join(command[:5])} ... did not finish in {bound:g} s") from None
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
        self.run("delete", kind, name, "--ignore-not-found", "--wait=true", f"--timeout={DELETE_TIMEOUT_S}s",
                 wait_s=DELETE_TIMEOUT_S)

    def rayjobs(self) -> list[dict[str, Any]]:
        """Every RayJob of the namespace."""
        return json.loads(self.run("get", "rayjobs", "-o", "json"))["items"]

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


def manifest_hash(manifest: dict[str, Any]) -> str:
    """The hash :data:`APPLIED_ANNOTATION` carries (of the manifest without that annotation)."""
    bare = json.loads(json.dumps(manifest))
    annotations = bare["metadata"].get("annotations")
    if annotations is not None:
        annotations.pop(APPLIED_ANNOTATION, None)
        if not annotations:
            del bare["metadata"]["annotations"]
    return hashlib.sha256(json.dumps(bare, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def annotated(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest as the pipeline applies it: with its own hash in :data:`APPLIED_ANNOTATION`."""
    out = json.loads(json.dumps(manifest))
    out["metadata"].setdefault("annotations", {})[APPLIED_ANNOTATION] = manifest_hash(manifest)
    return out


def live_manifest_hash(kube: "Kubectl", name: str) -> str:
    """The :data:`APPLIED_ANNOTATION` of the live RayCluster ("" when absent or not ours)."""
    live = kube.get("raycluster", name) or {}
    return (live.get("metadata", {}).get("annotations") or {}).get(APPLIED_ANNOTATION, "")


def pod_ready(pod: dict[str, Any]) -> bool:
    """The pod's ``Ready`` condition, or (without conditions) every container ready."""
    status = pod.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    if "Ready" in conditions:
        return conditions["Ready"] == "True"
    statuses = status.get("containerStatuses") or []
    return bool(statuses) and all(c.get("ready") for c in statuses)


def head_uid(pods: list[dict[str, Any]]) -> str:
    """The head pod's uid ("" without one)."""
    return next((p["metadata"].get("uid", "") for p in pods
                 if p["metadata"].get("labels", {}).get("ray.io/node-type") == "head"), "")


def not_ready(cluster: dict[str, Any] | None, pods: list[dict[str, Any]], *, repository: str, digest: str,
              replaced_head: str = "") -> str:
    """Why the RayCluster is not ready on ``digest`` ("" when it is): KubeRay's own state for
    the generation just applied, a head pod (another than the uid ``replaced_head``, when the
    spec changed), every pod Ready and none Terminating, every container of the image on the
    digest. Any number of workers: an on-cluster job's autoscaled ones count as well.

    A Recreate (KubeRay ``ray-operator/v1.7.0`` raycluster_controller.go ``reconcilePods``)
    deletes every pod, then creates the new head in a later reconcile: meanwhile the old pods
    are Terminating (``metadata.deletionTimestamp`` set, Kubernetes API conventions) and still
    Running and Ready, and ``state`` stays ``ready``."""
    if cluster is None:
        return "RayCluster not found"
    status = cluster.get("status") or {}
    if int(status.get("observedGeneration") or 0) < int(cluster["metadata"].get("generation") or 0):
        return f"KubeRay has not reconciled generation {cluster['metadata'].get('generation')} yet"
    if status.get("state") != READY_STATE:
        return f"state {status.get('state') or '(none)'}" + (f": {status['reason']}" if status.get("reason") else "")
    terminating = sorted(p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp"))
    if terminating:
        return f"pods Terminating: {', '.join(terminating)}"
    if not any(p["metadata"].get("labels", {}).get("ray.io/node-type") == "head" for p in pods):
        return "no head pod"
    if replaced_head and head_uid(pods) == replaced_head:
        return f"the head pod is still the one from before the apply (uid {replaced_head})"
    unready = sorted(p["metadata"]["name"] for p in pods if not pod_ready(p))
    if unready:
        return f"pods not Ready: {', '.join(unready)}"
    stale = sorted({i or "(not pulled)" for i in image_ids(pods, repository).values() if not runs_digest(i, digest)})
    return f"pods report {', '.join(stale)}" if stale else ""


def wait_ready(kube: Kubectl, cluster: dict[str, Any], *, repository: str, digest: str, timeout_s: float,
               poll_s: float, clock: Callable[[], float] = time.monotonic, replaced_head: str = "") -> dict[str, str]:
    """Wait until :func:`not_ready` says nothing; returns the image IDs. KubeError (with the
    last reason) once ``timeout_s`` has passed."""
    name = cluster["metadata"]["name"]
    deadline = clock() + timeout_s
    while True:
        live = kube.get("raycluster", name)
        pods = kube.cluster_pods(name)
        why = not_ready(live, pods, repository=repository, digest=digest, replaced_head=replaced_head)
        if not why:
            log(f"apply: RayCluster {name} ready, all {len(pods)} pods Ready on @{digest}")
            return image_ids(pods, repository)
        if clock() >= deadline:
            raise KubeError(f"RayCluster {name} not ready on @{digest} after {timeout_s:g} s: {why}")
        time.sleep(poll_s)
