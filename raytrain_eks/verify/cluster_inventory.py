"""What an existing EKS cluster already runs, read through kubectl (for `raytrain-eks verify` on
``cluster.existing``): its nodes, its Helm releases, its workloads, CRDs and namespaces, and for
each row of the add-on table whether (and at which version) the cluster has it.

An add-on is found the way Helm itself would collide with it:

- a deployed Helm release of the row's chart, under ANY release name and namespace. Helm 3
  keeps each release revision in a Secret (type ``helm.sh/release.v1``, labels ``owner=helm``,
  ``name=<release>``, ``status``, ``version``: helm/helm v3 pkg/storage/driver/secrets.go
  ``newSecretsObject``) whose ``release`` data is the release as JSON, gzipped, base64-encoded
  (pkg/storage/driver/util.go ``encodeRelease``); the API server base64-encodes Secret data once
  more. :func:`decode_release` is ``decodeRelease`` (gzip only when the magic header is there).
- else a Deployment or DaemonSet labelled ``app.kubernetes.io/name=<chart>`` (an install by
  other means; version unknown);
- else, for a row that ships its CRDs, any of those CRDs (a CRD chart of ours would collide
  with them: Helm refuses objects it does not own).

Which of these the table's rows are is data: a row added to the table is found the same way.
"""
from __future__ import annotations

import base64
import functools
import gzip
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from environment.addons import HelmAddon
from environment.queueing import KUEUE_RESOURCES

HELM_OWNER_SELECTOR = "owner=helm"
NAME_LABEL = "app.kubernetes.io/name"
NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
"""The label EKS puts on every node of a managed node group (its name)."""
_MAGIC_GZIP = b"\x1f\x8b\x08"

KUEUE_GROUP_SUFFIX = ".kueue.x-k8s.io"
KUEUE_MANAGER_CONFIG_KEY = "controller_manager_config.yaml"
KubeList = Callable[[str, str], list[dict[str, Any]]]
"""(kind, label selector or "") -> the items of ``kubectl get <kind> -A [-l selector] -o json``."""


def decode_release(secret_data: str) -> dict[str, Any]:
    """The release JSON a Helm 3 release Secret holds (``data.release`` as the API returns it)."""
    stored = base64.b64decode(base64.b64decode(secret_data))
    if len(stored) > 3 and stored[:3] == _MAGIC_GZIP:
        stored = gzip.decompress(stored)
    return json.loads(stored)


@dataclass(frozen=True, kw_only=True, slots=True)
class Release:
    name: str
    namespace: str
    chart: str
    version: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Found:
    """Where the cluster runs an add-on and how it was told: ``how`` is ``helm release NAME``,
    a workload, or its CRDs; ``version`` is "" when only a Helm release tells it."""

    namespace: str
    how: str
    version: str = ""

    def describe(self) -> str:
        return f"{self.how} in {self.namespace or '(cluster)'}" + (f", chart {self.version}" if self.version else "")


@dataclass(kw_only=True)
class Inventory:
    nodes: list[dict[str, Any]] = field(default_factory=list)
    releases: list[Release] = field(default_factory=list)
    workloads: list[dict[str, Any]] = field(default_factory=list)
    crds: set[str] = field(default_factory=set)
    namespaces: dict[str, dict[str, Any]] = field(default_factory=dict)
    served: dict[str, set[str]] = field(default_factory=dict)
    """Each CRD's served API versions (``spec.versions[].served``)."""
    manager_configs: dict[str, str] = field(default_factory=dict)
    """Kueue's manager configuration by namespace (``controller_manager_config.yaml`` of its
    ``<release>-manager-config`` ConfigMap: kueue chart v0.19.2 templates/manager/manager-config.yaml),
    read only when the cluster has Kueue's CRDs."""
    queue_objects: list[dict[str, Any]] = field(default_factory=list)
    """The cluster's Kueue objects of the kinds this app creates (environment/queueing.py
    ``KUEUE_RESOURCES``), each kind read only when its CRD is there."""

    def nodes_of(self, nodegroup: str) -> list[dict[str, Any]]:
        return [n for n in self.nodes if (n["metadata"].get("labels") or {}).get(NODEGROUP_LABEL) == nodegroup]


def read_inventory(kube_list: KubeList) -> Inventory:
    releases = []
    for secret in kube_list("secrets", HELM_OWNER_SELECTOR):
        labels = secret["metadata"].get("labels") or {}
        if labels.get("status") != "deployed" or "release" not in (secret.get("data") or {}):
            continue
        release = decode_release(secret["data"]["release"])
        metadata = (release.get("chart") or {}).get("metadata") or {}
        releases.append(Release(name=release.get("name", labels.get("name", "")),
                                namespace=release.get("namespace", secret["metadata"].get("namespace", "")),
                                chart=metadata.get("name", ""), version=metadata.get("version", "")))
    crds = kube_list("customresourcedefinitions", "")
    served = {c["metadata"]["name"]: {v["name"] for v in (c.get("spec") or {}).get("versions") or [] if v.get("served")}
              for c in crds}
    configs, queue_objects = {}, []
    if any(name.endswith(KUEUE_GROUP_SUFFIX) for name in served):
        for config_map in kube_list("configmaps", ""):
            text = (config_map.get("data") or {}).get(KUEUE_MANAGER_CONFIG_KEY)
            if text is not None:
                configs[config_map["metadata"].get("namespace", "")] = text
        for kind, plural in KUEUE_RESOURCES.items():
            if plural + KUEUE_GROUP_SUFFIX in served:
                queue_objects += [{**o, "kind": kind} for o in kube_list(plural + KUEUE_GROUP_SUFFIX, "")]
    return Inventory(
        nodes=kube_list("nodes", ""), releases=releases,
        workloads=kube_list("deployments", "") + kube_list("daemonsets", ""),
        crds=set(served), served=served, manager_configs=configs, queue_objects=queue_objects,
        namespaces={n["metadata"]["name"]: n for n in kube_list("namespaces", "")})


def crd_names(addon: HelmAddon, version: str) -> list[str]:
    """The CRDs a row ships at ``version`` (from its pinned CRD file; [] without one)."""
    if addon.crds is None or not addon.crds(version).is_file():
        return []
    return list(_crd_names_in(str(addon.crds(version))))


@functools.lru_cache(maxsize=None)
def _crd_names_in(path: str) -> tuple[str, ...]:
    """The pinned CRD files are read-only and large (KubeRay v1.7.0's: 2.3 MB): parsed once a
    process, with libyaml's loader where PyYAML has it (pure Python takes seconds on that file;
    charts/validate.py reads it the same way)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as handle:
        docs = yaml.load_all(handle.read(), Loader=loader)
        return tuple(d["metadata"]["name"] for d in docs if d and d.get("kind") == "CustomResourceDefinition")


def find_addon(inventory: Inventory, addon: HelmAddon, version: str) -> Found | None:
    """Where the cluster runs ``addon`` (None: nowhere), by the rules of the module docstring."""
    for release in inventory.releases:
        if release.chart == addon.chart:
            return Found(namespace=release.namespace, how=f"helm release {release.name}", version=release.version)
    for workload in inventory.workloads:
        if (workload["metadata"].get("labels") or {}).get(NAME_LABEL) == addon.chart:
            return Found(namespace=workload["metadata"].get("namespace", ""),
                         how=f"{workload.get('kind', 'workload')} {workload['metadata']['name']} (not a Helm release)")
    crds = [c for c in crd_names(addon, version) if c in inventory.crds]
    if crds:
        return Found(namespace="", how=f"its CRDs {', '.join(crds)} (no Helm release of {addon.chart})")
    return None
