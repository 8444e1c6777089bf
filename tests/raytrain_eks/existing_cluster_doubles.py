"""An existing EKS cluster as `raytrain-eks verify` sees it, for tests/raytrain_eks/verify/test_verify_existing.py:

- :class:`ModelledApi`: EKS and EC2 calls answered from a table, every request and response
  checked against botocore's own service model, as botocore's ``Stubber`` checks them
  (botocore/stub.py ``_assert_expected_params`` / ``_validate_operation_response``:
  ``validate_parameters`` against the operation's input and output shapes), but keyed by
  the call's parameters instead of by call order; a missing cluster or node group raises the
  client's own ``ResourceNotFoundException``. moto 5.2.5's EKS has no ``accessConfig``,
  ``clusterSecurityGroupId`` or add-ons, so it cannot model these.
- :func:`helm_release_secret`: a Helm 3 release Secret as the API server returns it, written by
  helm/helm v3 pkg/storage/driver/util.go ``encodeRelease`` (JSON, gzip at best compression,
  base64) inside ``newSecretsObject`` (pkg/storage/driver/secrets.go: labels ``name``,
  ``owner=helm``, ``status``, ``version``; type ``helm.sh/release.v1``), whose data the API
  base64-encodes once more.
- :func:`team_cluster`: the cluster infra_variants.existing_raw describes, right in every field;
  its VPC's route tables as EC2 DescribeRouteTables returns them (a main table, found by its
  ``Main`` association, for a subnet with no explicit one: Amazon VPC User Guide, "Route tables").

A module with a unique name, not conftest.
"""
from __future__ import annotations

import base64
import copy
import functools
import gzip
import json
from typing import Any

import boto3
from botocore.validate import validate_parameters

from environment.addons import NODE_MONITORING_AGENT, node_monitoring_configuration
from environment.contract import EFA_RESOURCE, GPU_RESOURCE
from infra_variants import (
    EXISTING_CLUSTER, EXISTING_GPU_GROUP, EXISTING_SECURITY_GROUP, EXISTING_SUBNETS, EXISTING_SYSTEM_GROUP, EXISTING_VPC,
)

ACCOUNT = "111122223333"


class ModelledApi:
    """``table[(operation, key)] = response``; ``key`` is the value of ``keys[operation]`` in the request."""

    def __init__(self, service: str, region: str, table: dict, keys: dict[str, str]) -> None:
        self._client = _model_client(service, region)
        self.exceptions = self._client.exceptions
        self.table, self.keys, self.calls = table, keys, []

    def __getattr__(self, name: str):
        if name not in self.keys:
            raise AttributeError(name)
        return lambda **params: self._answer(name, params)

    def _answer(self, name: str, params: dict) -> dict:
        model = self._client.meta.service_model.operation_model(self._client.meta.method_to_api_mapping[name])
        validate_parameters(params, model.input_shape)
        self.calls.append((name, params))
        key = frozen(params.get(self.keys[name]))
        if (name, key) not in self.table:
            raise self._client.exceptions.ResourceNotFoundException(
                {"Error": {"Code": "ResourceNotFoundException", "Message": f"{key} not found"}}, model.name)
        response = copy.deepcopy(self.table[(name, key)])
        validate_parameters(response, model.output_shape)
        return response


@functools.lru_cache(maxsize=None)
def _model_client(service: str, region: str):
    """A client used only for its service model and exception classes (it sends nothing):
    one per service and region, not one per ModelledApi (verify makes about 20 a run)."""
    return boto3.client(service, region_name=region, aws_access_key_id="t", aws_secret_access_key="t")


def frozen(value):
    """A request parameter as a table key: lists and dicts made hashable (``Filters``)."""
    if isinstance(value, dict):
        return tuple(sorted((k, frozen(v)) for k, v in value.items()))
    return tuple(frozen(v) for v in value) if isinstance(value, list) else value


def route(destination: str, **target: str) -> dict[str, Any]:
    """One route as DescribeRouteTables returns it (``Origin``: CreateRoute; ``local`` is the VPC's own)."""
    return {"DestinationCidrBlock": destination, "State": "active", "Origin": "CreateRoute", **target}


def team_cluster(env) -> dict[str, Any]:
    """Tables for EKS and EC2, and kubectl's lists, of the cluster ``env`` (existing_raw) describes."""
    c = env.cluster
    l4 = next(g for g in env.gpu_node_groups if g.existing)
    system = env.system_node_group
    cluster = {"name": EXISTING_CLUSTER, "arn": f"arn:aws:eks:{c.region}:{ACCOUNT}:cluster/{EXISTING_CLUSTER}",
               "version": c.kubernetes_version, "status": "ACTIVE",
               "resourcesVpcConfig": {"vpcId": EXISTING_VPC, "subnetIds": list(EXISTING_SUBNETS),
                                      "clusterSecurityGroupId": EXISTING_SECURITY_GROUP,
                                      "endpointPublicAccess": True, "endpointPrivateAccess": True,
                                      "publicAccessCidrs": list(c.public_access_cidrs)},
               "accessConfig": {"authenticationMode": "API_AND_CONFIG_MAP"}}

    def nodegroup(name: str, instance_type: str, labels: dict, taints: list, max_size: int, repair: bool = False) -> dict:
        return {"nodegroup": {"nodegroupName": name, "clusterName": EXISTING_CLUSTER, "status": "ACTIVE",
                              "instanceTypes": [instance_type], "labels": labels, "taints": taints,
                              "scalingConfig": {"minSize": 0, "maxSize": max_size, "desiredSize": 0},
                              "subnets": [EXISTING_SUBNETS[0]], "tags": {},
                              **({"nodeRepairConfig": {"enabled": True}} if repair else {})}}

    gpu_taints = [{"key": t["key"], "value": t["value"], "effect": "NO_SCHEDULE"} for t in l4.taints]
    eks = {
        ("describe_cluster", EXISTING_CLUSTER): {"cluster": cluster},
        ("list_nodegroups", EXISTING_CLUSTER): {"nodegroups": [EXISTING_SYSTEM_GROUP, EXISTING_GPU_GROUP]},
        ("describe_nodegroup", EXISTING_SYSTEM_GROUP): nodegroup(EXISTING_SYSTEM_GROUP, system.instance_type,
                                                                 system.labels, [], system.nodes),
        ("describe_nodegroup", EXISTING_GPU_GROUP): nodegroup(EXISTING_GPU_GROUP, l4.instance_type, l4.labels,
                                                              gpu_taints, l4.max_nodes, repair=True),
        ("list_addons", EXISTING_CLUSTER): {"addons": ["eks-pod-identity-agent", "vpc-cni", "coredns", "kube-proxy",
                                                       NODE_MONITORING_AGENT]},
    }
    for name, version, config in (("eks-pod-identity-agent", "v1.3.9-eksbuild.3", ""),
                                  ("vpc-cni", "v1.20.1-eksbuild.3", '{"enableNetworkPolicy":"true"}'),
                                  ("coredns", "v1.14.3-eksbuild.3", ""), ("kube-proxy", "v1.36.0-eksbuild.14", ""),
                                  (NODE_MONITORING_AGENT, "v1.6.2-eksbuild.1", json.dumps(node_monitoring_configuration()))):
        eks[("describe_addon", name)] = {"addon": {"addonName": name, "clusterName": EXISTING_CLUSTER,
                                                   "addonVersion": version, "status": "ACTIVE",
                                                   "configurationValues": config}}
    vpc_filter = frozen([{"Name": "vpc-id", "Values": [EXISTING_VPC]}])
    local = {**route("10.0.0.0/16", GatewayId="local"), "Origin": "CreateRouteTable"}
    # The first subnet on the VPC's main table (no explicit association), the second on its own:
    # both with a default route to a NAT gateway.
    ec2 = {("describe_subnets", tuple(EXISTING_SUBNETS)): {"Subnets": [
        {"SubnetId": s, "VpcId": EXISTING_VPC, "AvailabilityZone": az}
        for s, az in zip(EXISTING_SUBNETS, c.availability_zones)]},
        ("describe_route_tables", vpc_filter): {"RouteTables": [
            {"RouteTableId": "rtb-0main000000000000", "VpcId": EXISTING_VPC, "Routes": [
                local, route("0.0.0.0/0", NatGatewayId="nat-0aaaaaaaaaaaaaaa1")],
             "Associations": [{"Main": True, "RouteTableAssociationId": "rtbassoc-0main0000000000",
                               "RouteTableId": "rtb-0main000000000000", "AssociationState": {"State": "associated"}}]},
            {"RouteTableId": "rtb-0bbbbbbbbbbbbbbb2", "VpcId": EXISTING_VPC, "Routes": [
                local, route("0.0.0.0/0", NatGatewayId="nat-0aaaaaaaaaaaaaaa1")],
             "Associations": [{"Main": False, "RouteTableAssociationId": "rtbassoc-0bbbbbbbbbbbbbb2",
                               "RouteTableId": "rtb-0bbbbbbbbbbbbbbb2", "SubnetId": EXISTING_SUBNETS[1],
                               "AssociationState": {"State": "associated"}}]}]},
        ("describe_vpc_endpoints", vpc_filter): {"VpcEndpoints": []}}
    node = lambda name, group, labels, allocatable: {  # noqa: E731
        "kind": "Node", "metadata": {"name": name, "labels": {"eks.amazonaws.com/nodegroup": group, **labels}},
        "status": {"allocatable": allocatable}}
    lists = {
        "nodes": [node("ip-10-0-1-1", EXISTING_SYSTEM_GROUP, system.labels, {"cpu": "7910m"}),
                  node("ip-10-0-1-2", EXISTING_GPU_GROUP, l4.labels,
                       {"cpu": "47810m", GPU_RESOURCE: str(l4.gpus_per_node), EFA_RESOURCE: str(l4.efa_per_node)})],
        "secrets": [helm_release_secret("kuberay-operator", "kuberay-system", "kuberay-operator", "1.7.0"),
                    helm_release_secret("nvidia-device-plugin", "kube-system", "nvidia-device-plugin", "0.20.0"),
                    helm_release_secret("autoscaler", "kube-system", "cluster-autoscaler", "9.59.0")],
        "deployments": [], "daemonsets": [],
        "customresourcedefinitions": [{"metadata": {"name": "rayclusters.ray.io"}}, {"metadata": {"name": "rayjobs.ray.io"}}],
        "namespaces": [{"metadata": {"name": n, "labels": {"kubernetes.io/metadata.name": n}}}
                       for n in ("default", "kube-system", "kuberay-system")],
    }
    return {"eks": eks, "ec2": ec2, "lists": lists, "context_cluster": cluster["arn"]}


def helm_release_secret(release: str, namespace: str, chart: str, version: str, revision: int = 1,
                        status: str = "deployed") -> dict[str, Any]:
    body = {"name": release, "namespace": namespace, "version": revision, "info": {"status": status},
            "chart": {"metadata": {"name": chart, "version": version, "apiVersion": "v2"}}}
    encoded = base64.b64encode(gzip.compress(json.dumps(body).encode(), compresslevel=9)).decode()
    return {"apiVersion": "v1", "kind": "Secret", "type": "helm.sh/release.v1",
            "metadata": {"name": f"sh.helm.release.v1.{release}.v{revision}", "namespace": namespace,
                         "labels": {"name": release, "owner": "helm", "status": status, "version": str(revision)}},
            "data": {"release": base64.b64encode(encoded.encode()).decode()}}


EKS_KEYS = {"describe_cluster": "name", "list_nodegroups": "clusterName", "describe_nodegroup": "nodegroupName",
            "list_addons": "clusterName", "describe_addon": "addonName"}
EC2_KEYS = {"describe_subnets": "SubnetIds", "describe_route_tables": "Filters", "describe_vpc_endpoints": "Filters"}
