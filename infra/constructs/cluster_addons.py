"""The cluster's add-ons: the EKS managed ones (:class:`ManagedAddons`), the Helm ones
(:class:`ClusterAddons`), and the order every Kubernetes object of a stack is created in
(:func:`kubernetes_objects_after`).

The Helm add-ons are those of the environment package's add-on table
(:data:`environment.addons.ADDONS`): device plugins on the GPU nodes, the KubeRay operator and
cluster-autoscaler on the system nodes, Prometheus, Grafana and the GPU exporter, and whatever
else the table holds, each after the add-ons it requires, with its companion objects after it.
The caller resolves which entries are enabled, their versions, values and objects
(infra/build.py, from the spec).

An add-on whose entry names its CRDs gets them from a chart of their own, built here from the
pinned CRD file of the add-on's version, with the CRDs as TEMPLATES: Helm installs a chart's
``crds/`` directory once and never upgrades it, but upgrades templates with every release. A
version bump changes the file, hence the chart asset, hence the release: the CRDs are upgraded
before the operator (Helm never stores the client-side last-applied annotation that makes these
CRDs too large for ``kubectl apply``). The add-on's own chart keeps its ``crds/`` for kinds this
project does not use (Helm skips the ones that already exist).

The cluster runs EKS managed add-ons instead of the self-managed bootstrap copies: the
Pod Identity agent, the VPC CNI (with network-policy enforcement and a Pod Identity role of its
own), kube-proxy and CoreDNS, each pinned for the spec's Kubernetes version
(:data:`environment.addons.EKS_ADDONS`).

The CNI's EC2 network-interface permissions live on its own role, assumed only by the
``kube-system/aws-node`` service account through Pod Identity; the node role no longer carries
them, so a pod that reached the node's credentials could not use them.

Every Kubernetes object of the cluster stack waits for the nodes and cluster DNS. aws-cdk-lib 2.275's aws_eks_v2 makes each ``HelmChart``, ``KubernetesManifest``,
``KubernetesPatch`` and ``KubernetesObjectValue`` depend only on the cluster's kubectl barrier
(``Cluster._dependOnKubectlBarrier``, aws-eks-v2/lib/cluster.js): the control plane is up, but
no node may exist yet. A chart whose install runs hook Jobs (kube-prometheus-stack) then waits
for a pod that cannot be scheduled until Helm's timeout, the custom resource fails and the whole
cluster stack rolls back. So every such custom resource also depends on the system node group
(its nodes are Ready when CloudFormation sees it ACTIVE) and on the CoreDNS add-on (a hook Job
or webhook that resolves a service name needs it).

An aspect rather than a list: it also catches objects added later (``cluster.add_manifest`` in
any construct of the stack), whoever adds them.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import Aspects, CfnResource, Duration, IAspect, Stack, Stage, aws_eks_v2 as eks, aws_iam as iam, \
    aws_s3_assets as s3_assets
from constructs import Construct, IConstruct

from environment.addons import (APPLY_ONLY_TIMEOUT_S, EKS_ADDONS_BY_NAME, NODE_MONITORING_AGENT, HelmAddon, helm_timeout_s,
                                node_monitoring_configuration)
from infra.nag import MANAGED, acknowledge, acknowledge_chart_asset_read


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedAddon:
    """One enabled add-on with the version, values and companion objects the spec gives it."""
    addon: HelmAddon
    version: str
    values: dict[str, Any]
    objects: list[dict[str, Any]] = field(default_factory=list)
    crd_file: Path | None = None
    """The pinned CRDs of this version, for an add-on whose CRDs must be upgraded with it."""


def _has_null(value: Any) -> bool:
    if isinstance(value, dict):
        return any(v is None or _has_null(v) for v in value.values())
    if isinstance(value, list):
        return any(v is None or _has_null(v) for v in value)
    return False


def construct_id(key: str) -> str:
    """``kuberay_operator`` -> ``KuberayOperator`` (stable: logical ids derive from it)."""
    return "".join(part.capitalize() for part in key.split("_"))


def crd_chart_name(addon: HelmAddon) -> str:
    return f"{addon.release}-crds"


def write_crd_chart(addon: HelmAddon, version: str, crd_file: Path, outdir: Path) -> Path:
    """A Helm chart directory holding ``crd_file`` as its one template; its version is the
    add-on's (a leading ``v`` dropped: chart versions are SemVer). Returns the directory."""
    text = crd_file.read_text(encoding="utf-8")
    chart = outdir / f"{crd_chart_name(addon)}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    (chart / "templates").mkdir(parents=True, exist_ok=True)
    (chart / "Chart.yaml").write_text(
        f"apiVersion: v2\nname: {crd_chart_name(addon)}\nversion: {version.lstrip('v')}\n"
        f"appVersion: \"{version}\"\ndescription: CRDs of {addon.chart} {version}, upgraded with it\n",
        encoding="utf-8")
    (chart / "templates" / "crds.yaml").write_text(text, encoding="utf-8")
    return chart


class ClusterAddons(Construct):
    """One ``HelmChart`` per resolved add-on; :attr:`charts` maps the add-on key to it and
    :attr:`crd_charts` the key to its CRD chart, where it has one; :attr:`objects` the key to
    the manifest of its companion objects, and to their list in :attr:`object_lists`.

    ``present``: add-ons the existing cluster already runs whose objects are still this app's
    (``HelmAddon.manifests_when_present``): their objects only, created and never adopted (no
    Overwrite: a same-named object of the cluster's fails the deploy, so a destroy never deletes it)."""

    def __init__(self, scope: Construct, construct_id_: str, *, cluster: eks.ICluster,
                 addons: list[ResolvedAddon], present: list[ResolvedAddon] = ()) -> None:
        super().__init__(scope, construct_id_)
        self.charts: dict[str, eks.HelmChart] = {}
        self.crd_charts: dict[str, eks.HelmChart] = {}
        self.objects: dict[str, eks.KubernetesManifest] = {}
        self.object_lists: dict[str, list[dict[str, Any]]] = {}
        for item in addons:
            addon = item.addon
            chart = self.charts[addon.key] = eks.HelmChart(
                self, construct_id(addon.key), cluster=cluster,
                repository=addon.repository, chart=addon.chart, release=addon.release,
                version=item.version, namespace=addon.namespace,
                create_namespace=addon.create_namespace or None, values=item.values,
                wait=addon.wait or None, timeout=Duration.seconds(helm_timeout_s(addon)))
            if _has_null(item.values):
                # jsii drops None on the way to aws_eks_v2 (and JSON.stringify an undefined), but a
                # null is how Helm deletes a chart default: write the values verbatim instead.
                chart.node.find_child("Resource").node.default_child.add_property_override(
                    "Values", json.dumps(item.values, separators=(",", ":")))
            for required in addon.requires:  # ADDONS lists them first
                if required in self.charts:
                    chart.node.add_dependency(self.charts[required])
            if item.crd_file is not None:
                self.crd_charts[addon.key] = self._crd_chart(cluster, item)
                chart.node.add_dependency(self.crd_charts[addon.key])
            if item.objects:  # after the chart: its namespace and CRDs exist by then
                self._objects(cluster, item, overwrite=True).node.add_dependency(chart)
        for item in present:
            if item.objects:
                self._objects(cluster, item, overwrite=False)

    def _objects(self, cluster: eks.ICluster, item: ResolvedAddon, *, overwrite: bool) -> eks.KubernetesManifest:
        key = item.addon.key
        self.object_lists[key] = item.objects
        self.objects[key] = eks.KubernetesManifest(self, f"{construct_id(key)}Objects", cluster=cluster,
                                                   manifest=item.objects, overwrite=overwrite)
        return self.objects[key]

    def objects_after(self, namespace: str, manifest: Construct) -> None:
        """Every companion manifest holding an object of ``namespace`` waits for ``manifest``
        (the one creating that namespace): aws_eks_v2's kubectl handler fails a create in a
        namespace that does not exist yet, and on delete the namespace goes last."""
        for key, objects in self.object_lists.items():
            if any((o.get("metadata") or {}).get("namespace") == namespace for o in objects):
                self.objects[key].node.add_dependency(manifest)

    def _crd_chart(self, cluster: eks.ICluster, item: ResolvedAddon) -> eks.HelmChart:
        addon = item.addon
        staging = Path(Stage.of(self).outdir) / ".crd-charts"
        directory = write_crd_chart(addon, item.version, item.crd_file, staging)
        asset = s3_assets.Asset(self, f"{construct_id(addon.key)}CrdChart", path=str(directory))
        acknowledge_chart_asset_read(cluster)
        return eks.HelmChart(
            self, f"{construct_id(addon.key)}Crds", cluster=cluster, chart_asset=asset,
            release=crd_chart_name(addon), namespace=addon.namespace,
            create_namespace=addon.create_namespace or None,
            timeout=Duration.seconds(APPLY_ONLY_TIMEOUT_S))


# --- The EKS managed add-ons (the module docstring says why) ----------------------------------

CNI_SERVICE_ACCOUNT = "aws-node"
CNI_POLICY = "AmazonEKS_CNI_Policy"
CNI_CONFIGURATION = {"enableNetworkPolicy": "true"}
"""The VPC CNI's network-policy agent enforces NetworkPolicies (the value is the STRING "true")."""


class ManagedAddons(Construct):
    """Exposes :attr:`addons` (EKS add-on name -> ``CfnAddon``), :attr:`pod_identity_agent`,
    :attr:`cni_role`, and :attr:`before_nodes` (the add-ons nodes need to become Ready)."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.Cluster,
                 kubernetes_version: str) -> None:
        super().__init__(scope, construct_id)
        self.cni_role = iam.Role(
            self, "CniRole", description="VPC CNI (kube-system/aws-node) through EKS Pod Identity",
            # Only this cluster's kube-system pods (the session tags EKS Pod Identity sends).
            assumed_by=iam.SessionTagsPrincipal(iam.ServicePrincipal("pods.eks.amazonaws.com")).with_conditions({
                "StringEquals": {"aws:RequestTag/eks-cluster-arn": cluster.cluster_arn,
                                 "aws:RequestTag/kubernetes-namespace": "kube-system"}}),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(CNI_POLICY)])
        acknowledge(self.cni_role, MANAGED.format(CNI_POLICY),
                    "The AWS managed policy EKS documents for the VPC CNI (ENI and IP assignment); "
                    "on a role only kube-system/aws-node can assume, no longer on the node role.")
        extra = {
            "vpc-cni": dict(configuration_values=json.dumps(CNI_CONFIGURATION),
                            pod_identity_associations=[eks.CfnAddon.PodIdentityAssociationProperty(
                                role_arn=self.cni_role.role_arn, service_account=CNI_SERVICE_ACCOUNT)]),
        }
        extra[NODE_MONITORING_AGENT] = dict(configuration_values=json.dumps(node_monitoring_configuration()))
        self.addons: dict[str, eks.CfnAddon] = {}
        for name in ("eks-pod-identity-agent", "vpc-cni", "kube-proxy", "coredns", NODE_MONITORING_AGENT):
            self.addons[name] = eks.CfnAddon(
                self, name, cluster_name=cluster.cluster_name, addon_name=name,
                addon_version=EKS_ADDONS_BY_NAME[name].versions[kubernetes_version],
                # Take over whatever a previous install left (e.g. the bootstrap copies).
                resolve_conflicts="OVERWRITE", **extra.get(name, {}))
        # The CNI's credentials come through the agent's association.
        self.addons["vpc-cni"].node.add_dependency(self.addons["eks-pod-identity-agent"])
        self.pod_identity_agent = self.addons["eks-pod-identity-agent"]
        self.before_nodes = [self.addons[n] for n in ("eks-pod-identity-agent", "vpc-cni", "kube-proxy")]
        """DaemonSets a node needs to become Ready; CoreDNS (a Deployment) needs nodes instead."""


# --- Every Kubernetes object after the nodes (the module docstring says why) -------------------

KUBERNETES_RESOURCE_TYPES = frozenset({
    "Custom::AWSCDK-EKS-HelmChart",
    "Custom::AWSCDK-EKS-KubernetesResource",
    "Custom::AWSCDK-EKS-KubernetesPatch",
    "Custom::AWSCDK-EKS-KubernetesObjectValue",
})
"""The custom-resource types aws_eks_v2's kubectl provider handles (one per construct class)."""


@jsii.implements(IAspect)
class _AfterNodes:
    def __init__(self, prerequisites: list[CfnResource]) -> None:
        self._prerequisites = prerequisites

    def visit(self, node: IConstruct) -> None:
        if isinstance(node, CfnResource) and node.cfn_resource_type in KUBERNETES_RESOURCE_TYPES:
            for prerequisite in self._prerequisites:
                node.node.add_dependency(prerequisite)


def kubernetes_objects_after(stack: Stack, *prerequisites: CfnResource) -> None:
    """Make every Kubernetes custom resource in ``stack`` depend on each of ``prerequisites``."""
    Aspects.of(stack).add(_AfterNodes(list(prerequisites)))
