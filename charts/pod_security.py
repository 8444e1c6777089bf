"""The security settings of every pod the project creates (Ray heads, workers, submitters).

- No privilege escalation, the container runtime's default seccomp profile, and every Linux
  capability dropped. Ray, NCCL over sockets and the S3 clients need none of them.
- EFA: the AWS EFA device plugin hands the ``/dev/infiniband`` devices to the pod, so no
  privileged mode is needed (EKS user guide, "Run machine learning training on Amazon EKS with
  Elastic Fabric Adapter": the device plugin "does not require a Pod to run in privileged
  mode"; AWS's own EKS training manifests set no capabilities at all). The one capability kept,
  on GPU workers with EFA only, is ``IPC_LOCK``: libfabric's EFA provider pins the buffers it
  registers with the NIC, and the kernel lets a process pin more than its ``RLIMIT_MEMLOCK``
  only with ``IPC_LOCK``. That limit inside the container is inherited from containerd (the
  AL2023 runtime spec sets only ``RLIMIT_NOFILE``), so without the capability NCCL's EFA
  transport would depend on a node setting this project does not own. Pinned pages stay
  charged to the pod's memory limit (Guaranteed QoS), so the capability adds no way past it.
- No Kubernetes service-account token: nothing in these pods calls the Kubernetes API, except
  the Ray autoscaler sidecar KubeRay adds to the long-lived cluster's head (it scales the
  RayCluster's worker group through the API), so that one head keeps its token. EKS
  Pod Identity does not use that token: its admission webhook mounts a separate projected
  token (audience ``pods.eks.amazonaws.com``) at
  ``/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token`` and sets
  ``AWS_CONTAINER_CREDENTIALS_FULL_URI`` (the node agent, ``http://169.254.170.23/v1/credentials``)
  and ``AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE``; the AWS SDKs' container credential provider
  reads those, whatever ``automountServiceAccountToken`` says.
"""
from __future__ import annotations

from typing import Any

EFA_CAPABILITIES = ("IPC_LOCK",)
"""Added back on GPU workers with EFA interfaces (see the module docstring for why)."""
SECCOMP = {"type": "RuntimeDefault"}


def container_security(add: tuple[str, ...] = ()) -> dict[str, Any]:
    """``securityContext`` of one container: nothing but ``add`` among the capabilities."""
    capabilities: dict[str, list[str]] = {"drop": ["ALL"]}
    if add:
        capabilities["add"] = list(add)
    return {"allowPrivilegeEscalation": False, "privileged": False,
            "capabilities": capabilities, "seccompProfile": dict(SECCOMP)}


def secure_pod(pod: dict[str, Any], add: tuple[str, ...] = (), *, automount_token: bool = False) -> dict[str, Any]:
    """``pod`` (a pod spec) with the pod- and container-level settings above. KubeRay copies the
    Ray container's ``securityContext`` to the ``wait-gcs-ready`` init container it injects.
    ``automount_token``: only for a pod that calls the Kubernetes API (the autoscaling head)."""
    containers = [{**c, "securityContext": container_security(add)} for c in pod["containers"]]
    return {**pod, "automountServiceAccountToken": automount_token,
            "securityContext": {"seccompProfile": dict(SECCOMP)}, "containers": containers}
