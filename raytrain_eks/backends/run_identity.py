"""A run's own AWS identity on EKS: a service account named after the run, associated through
EKS Pod Identity with the run role (infra/constructs/pod_identity.py ``RayIdentity.run_role``).

EKS Pod Identity tags every role session with the pod's service account
(``kubernetes-service-account``; Amazon EKS User Guide, "Grant Pods access to AWS resources based
on tags"), and the run role's S3 grants name the run's folder through that tag: the pods of run A
cannot reach run B's folder. An association names ONE service account (the EKS API's
``CreatePodIdentityAssociation`` takes ``namespace`` and ``serviceAccount``, no pattern), so each
run gets its own, made here by whoever starts the run (``submit`` with the operator's rights, the
pipeline's Smoke step with its build role) before its RayJob is applied, and removed once the run
is over (``submit`` after the copy, ``stop``). The API is eventually consistent ("may take several
seconds to be effective"): the association is made before the RayJob, whose pods come minutes
later (Kueue's queue, node scale-up, the image pull).

The long-lived RayCluster's pods keep the spec's ``ray.service_account`` (single-team mode).
"""
from __future__ import annotations

from typing import Any, Callable

from environment.contract import PART_OF, run_role_name


def eks_client(region: str) -> Any:
    """boto3's EKS client (the tests put a double of the Pod Identity association API here)."""
    import boto3

    return boto3.client("eks", region_name=region)


def service_account(run: str, namespace: str) -> dict[str, Any]:
    """The run's service account (no token automount: nothing in the Ray pods calls the Kubernetes API)."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": False,
            "metadata": {"name": run, "namespace": namespace, "labels": dict(PART_OF)}}


def role_arn(cluster_name: str, account: str, partition: str = "aws") -> str:
    """The run role's ARN (a fixed name: infra/constructs/pod_identity.py names it the same way)."""
    return f"arn:{partition}:iam::{account}:role/{run_role_name(cluster_name)}"


def caller_account(sts: Any) -> tuple[str, str]:
    """``(account, partition)`` of the credentials in use."""
    arn = sts.get_caller_identity()["Arn"]
    return arn.split(":")[4], arn.split(":")[1]


def _existing(eks: Any, cluster: str, namespace: str, run: str) -> list[dict[str, Any]]:
    found, token = [], None
    while True:
        page = eks.list_pod_identity_associations(clusterName=cluster, namespace=namespace, serviceAccount=run,
                                                  **({"nextToken": token} if token else {}))
        found += page.get("associations", [])
        token = page.get("nextToken")
        if not token:
            return found


def ensure(eks: Any, *, cluster: str, namespace: str, run: str, role: str,
           say: Callable[[str], None] = print) -> str:
    """The association of ``namespace/run`` with the run role (made unless it exists); its id."""
    found = _existing(eks, cluster, namespace, run)
    if found:
        return found[0]["associationId"]
    made = eks.create_pod_identity_association(
        clusterName=cluster, namespace=namespace, serviceAccount=run, roleArn=role,
        tags={"app.kubernetes.io/part-of": PART_OF["app.kubernetes.io/part-of"], "raytrain.io/run": run})
    say(f"    identity: service account {namespace}/{run} -> {role} (this run's folder only)")
    return made["association"]["associationId"]


def release(eks: Any, *, cluster: str, namespace: str, run: str) -> int:
    """Delete the run's associations (its pods are gone: nothing else uses that account); how many."""
    found = _existing(eks, cluster, namespace, run)
    for association in found:
        eks.delete_pod_identity_association(clusterName=cluster, associationId=association["associationId"])
    return len(found)
