"""Installs every Helm add-on of the environment package's add-on table
(:data:`environment.addons.ADDONS`): device plugins on the GPU nodes, the KubeRay operator on the
system nodes, Prometheus, Grafana and the GPU exporter, and whatever else the table holds, each
after the add-ons it requires, with its companion objects after it. Versions come from the
spec's ``[versions]``."""
from __future__ import annotations

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from environment import Environment
from environment.addons import ADDONS


def construct_id(key: str) -> str:
    """``kuberay_operator`` -> ``KuberayOperator`` (stable: logical ids derive from it)."""
    return "".join(part.capitalize() for part in key.split("_"))


class ClusterAddons(Construct):
    """One ``HelmChart`` per enabled add-on; :attr:`charts` maps the add-on key to it."""

    def __init__(self, scope: Construct, construct_id_: str, *, cluster: eks.Cluster,
                 env_spec: Environment) -> None:
        super().__init__(scope, construct_id_)
        self.charts: dict[str, eks.HelmChart] = {}
        for addon in ADDONS:
            if not addon.enabled(env_spec):
                continue
            chart = self.charts[addon.key] = eks.HelmChart(
                self, construct_id(addon.key), cluster=cluster,
                repository=addon.repository, chart=addon.chart, release=addon.release,
                version=env_spec.versions.chart(addon.key), namespace=addon.namespace,
                create_namespace=addon.create_namespace or None, values=addon.values(env_spec))
            for required in addon.requires:  # ADDONS lists them first
                if required in self.charts:
                    chart.node.add_dependency(self.charts[required])
            objects = addon.manifests(env_spec)
            if objects:  # after the chart: its namespace and CRDs exist by then
                manifest = eks.KubernetesManifest(self, f"{construct_id(addon.key)}Objects", cluster=cluster,
                                                  manifest=objects, overwrite=True)
                manifest.node.add_dependency(chart)
