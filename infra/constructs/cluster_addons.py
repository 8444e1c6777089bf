"""Installs the Helm add-ons of the environment package's add-on table
(:data:`environment.addons.ADDONS`): device plugins on the GPU nodes, the KubeRay operator and
cluster-autoscaler on the system nodes, Prometheus, Grafana and the GPU exporter, and whatever
else the table holds, each after the add-ons it requires, with its companion objects after it.
The caller resolves which entries are enabled, their versions, values and objects
(infra/build.py, from the spec)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from environment.addons import HelmAddon


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedAddon:
    """One enabled add-on with the version, values and companion objects the spec gives it."""
    addon: HelmAddon
    version: str
    values: dict[str, Any]
    objects: list[dict[str, Any]] = field(default_factory=list)


def construct_id(key: str) -> str:
    """``kuberay_operator`` -> ``KuberayOperator`` (stable: logical ids derive from it)."""
    return "".join(part.capitalize() for part in key.split("_"))


class ClusterAddons(Construct):
    """One ``HelmChart`` per resolved add-on; :attr:`charts` maps the add-on key to it."""

    def __init__(self, scope: Construct, construct_id_: str, *, cluster: eks.Cluster,
                 addons: list[ResolvedAddon]) -> None:
        super().__init__(scope, construct_id_)
        self.charts: dict[str, eks.HelmChart] = {}
        for item in addons:
            addon = item.addon
            chart = self.charts[addon.key] = eks.HelmChart(
                self, construct_id(addon.key), cluster=cluster,
                repository=addon.repository, chart=addon.chart, release=addon.release,
                version=item.version, namespace=addon.namespace,
                create_namespace=addon.create_namespace or None, values=item.values)
            for required in addon.requires:  # ADDONS lists them first
                if required in self.charts:
                    chart.node.add_dependency(self.charts[required])
            if item.objects:  # after the chart: its namespace and CRDs exist by then
                manifest = eks.KubernetesManifest(self, f"{construct_id(addon.key)}Objects", cluster=cluster,
                                                  manifest=item.objects, overwrite=True)
                manifest.node.add_dependency(chart)
