"""What KubeRay's ``upgradeStrategy: Recreate`` hashes: a change of this hash deletes the head
and every worker of a running RayCluster and recreates them (and kills any job on it).

Port of ``ray-project/kuberay`` tag ``ray-operator/v1.7.0``,
``ray-operator/controllers/ray/utils/util.go`` ``GenerateHashWithoutReplicasAndWorkersToDelete``
(used by ``raycluster_controller.go`` ``shouldRecreatePodsForUpgrade``): the whole RayCluster
SPEC (pod templates with their labels and annotations included) is hashed, except the head's and
every worker template's ``tolerations`` and ``schedulingGates``, each group's ``replicas``,
``minReplicas``, ``maxReplicas`` and ``scaleStrategy.workersToDelete``, and ``upgradeStrategy``.
The object's own ``metadata`` is not part of it. Go hashes its JSON; equal dictionaries give
equal JSON, so comparing this hash between two synths answers the same question.
"""
from __future__ import annotations

import copy
import hashlib
import json


def hashed_spec(spec: dict) -> dict:
    muted = copy.deepcopy(spec)
    for template in [muted["headGroupSpec"]["template"]] + [g["template"] for g in muted.get("workerGroupSpecs", [])]:
        template.get("spec", {}).pop("tolerations", None)
        template.get("spec", {}).pop("schedulingGates", None)
    for group in muted.get("workerGroupSpecs", []):
        for key in ("replicas", "minReplicas", "maxReplicas"):
            group.pop(key, None)
        group.get("scaleStrategy", {}).pop("workersToDelete", None)
    muted.pop("upgradeStrategy", None)
    return muted


def recreate_hash(spec: dict) -> str:
    return hashlib.sha256(json.dumps(hashed_spec(spec), sort_keys=True).encode()).hexdigest()
