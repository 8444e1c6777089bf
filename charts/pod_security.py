"""The security settings of every pod the project creates (Ray heads, workers, submitters).

- No privilege escalation, the container runtime's default seccomp profile, and every Linux
  capability dropped, on every container, none added back. Ray, NCCL (sockets or EFA) and the
  S3 clients need none. KubeRay copies the Ray container's ``securityContext`` to the
  ``wait-gcs-ready`` init container it injects into workers, and the autoscaler sidecar gets
  :func:`container_security` through ``autoscalerOptions``, so the pods KubeRay creates pass the
  Ray namespace's Pod Security level ``baseline`` (:data:`environment.contract.POD_SECURITY_LABELS`,
  enforced) and every ``restricted`` check but ``runAsNonRoot`` (the DLC runs as root).
- EFA: the AWS EFA device plugin hands the ``/dev/infiniband`` devices to the pod, so no
  privileged mode is needed (EKS user guide, "Run machine learning training on Amazon EKS with
  Elastic Fabric Adapter": the device plugin "does not require a Pod to run in privileged
  mode"). libfabric's EFA provider pins the buffers it registers with the NIC, up to
  ``RLIMIT_MEMLOCK``; that limit comes from the GPU node's containerd runtime spec
  (:data:`environment.contract.EFA_MEMLOCK_RLIMIT`), not from the capability ``IPC_LOCK``,
  which baseline forbids. Pinned pages stay charged to the pod's memory limit.
- No Kubernetes service-account token mounted: nothing in these pods calls the Kubernetes API,
  except the Ray autoscaler sidecar KubeRay adds to the long-lived cluster's head (it scales the
  RayCluster's worker group through the API), which alone mounts the token
  (charts/cluster_spec.py ``API_TOKEN_PROJECTION``). EKS
  Pod Identity does not use that token: its admission webhook mounts a separate projected
  token (audience ``pods.eks.amazonaws.com``) at
  ``/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token`` and sets
  ``AWS_CONTAINER_CREDENTIALS_FULL_URI`` (the node agent, ``http://169.254.170.23/v1/credentials``)
  and ``AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE``; the AWS SDKs' container credential provider
  reads those, whatever ``automountServiceAccountToken`` says.
"""
from __future__ import annotations

from typing import Any

SECCOMP = {"type": "RuntimeDefault"}


def container_security() -> dict[str, Any]:
    """``securityContext`` of one container: no capability at all."""
    return {"allowPrivilegeEscalation": False, "privileged": False,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": dict(SECCOMP)}


def secure_pod(pod: dict[str, Any], *, automount_token: bool = False) -> dict[str, Any]:
    """``pod`` (a pod spec) with the pod- and container-level settings above.
    ``automount_token``: for a pod whose every container calls the Kubernetes API (none here)."""
    containers = [{**c, "securityContext": container_security()} for c in pod["containers"]]
    return {**pod, "automountServiceAccountToken": automount_token,
            "securityContext": {"seccompProfile": dict(SECCOMP)}, "containers": containers}
