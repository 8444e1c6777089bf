"""What `raytrain-eks verify` talks to in the tests, each modelling the real service:

- moto's server on 127.0.0.1 (``moto.server.ThreadedMotoServer``, started here; the session's
  S3 store, tests/fixtures_s3.py, runs the same app behind devtools/slow_store.py's layer) for STS,
  CloudFormation and EC2's instance-type offerings (moto ships AWS's offering tables);
- moto's EKS for the spec's cluster and node groups (a missing cluster is asked with
  DescribeCluster: moto's ListNodegroups answers 500, not ResourceNotFoundException, there);
- botocore's Stubber, where moto 5.2.5 lacks the API: EKS DescribeAddonVersions, Service Quotas
  GetServiceQuota for EC2 quotas, EC2 DescribeCapacityReservations. A Stubber checks every
  request and response against botocore's own service model
  (botocore/data/<service>/<api-version>/service-2.json), so the shapes are the API's;
- a local HTTP server serving Helm repository ``index.yaml`` files under
  ``/<repository host><path>/index.yaml`` (what ``--helm-repo-mirror`` reads), in the
  format Helm writes (helm/helm v3 pkg/repo/index.go: ``apiVersion: v1``, ``entries`` of
  chart name -> list of chart versions).

A module with a unique name, not conftest: several test folders have a conftest.py.
"""
from __future__ import annotations

import functools
import http.server
import json
import logging
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.stub import Stubber

from raytrain_eks.backends.local_services import free_port  # noqa: F401  (one port picker; re-exported)

from environment.addons import ADDONS, EKS_ADDONS

MOTO_ACCOUNT = "123456789012"
"""The account moto's STS answers for."""




@dataclass
class MotoServer:
    endpoint_url: str

    def client(self, service: str, region: str):
        return boto3.client(service, region_name=region, endpoint_url=self.endpoint_url,
                            aws_access_key_id="testing", aws_secret_access_key="testing")


def start_moto():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, MotoServer(endpoint_url=f"http://127.0.0.1:{port}")


BOOTSTRAP_TEMPLATE = {
    # The part of the CDK bootstrap template verify reads: its BootstrapVersion output
    # (aws-cdk's lib/api/bootstrap/bootstrap-template.yaml: the value of the SSM parameter
    # /cdk-bootstrap/hnb659fds/version, here written as a literal: moto does not resolve
    # Fn::GetAtt of a parameter's Value).
    "Resources": {"CdkBootstrapVersion": {"Type": "AWS::SSM::Parameter", "Properties": {
        "Type": "String", "Name": "/cdk-bootstrap/hnb659fds/version", "Value": "{version}"}}},
    "Outputs": {"BootstrapVersion": {"Value": "{version}"}},
}


def create_bootstrap_stack(moto: MotoServer, region: str, version: int) -> None:
    body = json.dumps(BOOTSTRAP_TEMPLATE).replace("{version}", str(version))
    moto.client("cloudformation", region).create_stack(StackName="CDKToolkit", TemplateBody=body)


def addon_versions_response(name: str, kubernetes_version: str, versions: list[str]) -> dict:
    """EKS DescribeAddonVersions for one add-on and one Kubernetes version."""
    return {"addons": [{"addonName": name, "type": "networking", "addonVersions": [
        {"addonVersion": v, "architecture": ["amd64", "arm64"],
         "compatibilities": [{"clusterVersion": kubernetes_version, "platformVersions": ["*"],
                              "defaultVersion": i == 0}]}
        for i, v in enumerate(versions)]}]}


def stub_eks(region: str, kubernetes_version: str, offered: dict[str, list[str]] | None = None):
    """A stubbed EKS client answering one DescribeAddonVersions per EKS add-on, in
    EKS_ADDONS order; ``offered`` overrides an add-on's list (default: its pin only)."""
    client = boto3.client("eks", region_name=region, aws_access_key_id="t", aws_secret_access_key="t")
    stub = Stubber(client)
    for addon in EKS_ADDONS:
        versions = (offered or {}).get(addon.name, [addon.versions[kubernetes_version]])
        stub.add_response("describe_addon_versions",
                          addon_versions_response(addon.name, kubernetes_version, versions),
                          {"addonName": addon.name, "kubernetesVersion": kubernetes_version})
    stub.activate()
    return client


def stub_quotas(region: str, values: dict[str, float]):
    """Service Quotas GetServiceQuota for EC2 quota codes, in the order given."""
    client = boto3.client("service-quotas", region_name=region, aws_access_key_id="t", aws_secret_access_key="t")
    stub = Stubber(client)
    for code, value in values.items():
        stub.add_response("get_service_quota", {"Quota": {
            "ServiceCode": "ec2", "QuotaCode": code, "QuotaName": f"Running On-Demand ({code})",
            "Value": value, "Unit": "None", "Adjustable": True}},
            {"ServiceCode": "ec2", "QuotaCode": code})
    stub.activate()
    return client


class SplitEc2:
    """Offerings from moto's EC2; capacity reservations from a stub (moto lacks the call)."""

    def __init__(self, moto_ec2, reservations_client):
        self.describe_instance_type_offerings = moto_ec2.describe_instance_type_offerings
        self.describe_availability_zones = moto_ec2.describe_availability_zones
        self.get_paginator = moto_ec2.get_paginator
        self.describe_capacity_reservations = reservations_client.describe_capacity_reservations


class SplitEks:
    """Node groups from moto's EKS (moto 5.2.5 models DescribeCluster, ListNodegroups and
    DescribeNodegroup with their tags, moto/eks/models.py); add-on versions from a stub."""

    def __init__(self, moto_eks, addons_client):
        self.exceptions = moto_eks.exceptions
        self.describe_cluster = moto_eks.describe_cluster
        self.list_nodegroups = moto_eks.list_nodegroups
        self.describe_nodegroup = moto_eks.describe_nodegroup
        self.get_paginator = addons_client.get_paginator  # DescribeAddonVersions


def index_yaml(entries: dict[str, list[str]]) -> str:
    lines = ["apiVersion: v1", "entries:"]
    for chart, versions in entries.items():
        lines.append(f"  {chart}:")
        for v in versions:
            lines += [f"  - name: {chart}", f"    version: {v}", "    apiVersion: v2",
                      f"    urls:", f"    - {chart}-{v}.tgz"]
    return "\n".join(lines) + "\ngenerated: \"2026-12-01T00:00:00Z\"\n"


def write_chart_indexes(root: Path, versions: dict[str, list[str]]) -> None:
    """One index.yaml per repository of the add-on table; ``versions``: chart -> versions."""
    by_repository: dict[str, dict[str, list[str]]] = {}
    for addon in ADDONS:
        if addon.repository.startswith("oci://"):  # a registry's tag list (chart_index.oci_tags_url)
            parsed = urllib.parse.urlsplit(addon.repository)
            folder = root / parsed.netloc / "v2" / parsed.path.lstrip("/") / "tags"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "list").write_text(json.dumps({"name": parsed.path.lstrip("/"),
                                                     "tags": versions.get(addon.chart, [])}))
            continue
        by_repository.setdefault(addon.repository, {})[addon.chart] = versions.get(addon.chart, [])
    for repository, entries in by_repository.items():
        parsed = urllib.parse.urlsplit(repository.rstrip("/"))
        folder = root / parsed.netloc / parsed.path.lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "index.yaml").write_text(index_yaml(entries))


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve_directory(root: Path):
    """A threaded HTTP server on 127.0.0.1 serving ``root``; returns (server, base URL)."""
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
