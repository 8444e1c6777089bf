"""Network stack: public + private subnets in the spec's AZs, one NAT, an S3 gateway endpoint,
and GPU nodes in exactly the private subnet of the GPU AZ."""
from __future__ import annotations

from aws_cdk.assertions import Match


def _subnets(synth) -> dict[str, dict]:
    return synth.resources("network", "AWS::EC2::Subnet")


def _export_to_subnet(synth) -> dict[str, str]:
    """Export name -> subnet logical id (the cluster stack imports subnets by export)."""
    outputs = synth.json("network")["Outputs"]
    return {o["Export"]["Name"]: o["Value"]["Ref"] for o in outputs.values()
            if "Export" in o and isinstance(o["Value"], dict) and "Ref" in o["Value"]}


def test_public_and_private_subnets_in_every_spec_az(variant):
    # given the spec's AZs, when synthesized, then each AZ has one public and one private subnet
    subnets = _subnets(variant)
    azs = variant.env.cluster.availability_zones
    public = sorted(s["Properties"]["AvailabilityZone"] for s in subnets.values()
                    if s["Properties"]["MapPublicIpOnLaunch"])
    private = sorted(s["Properties"]["AvailabilityZone"] for s in subnets.values()
                     if not s["Properties"]["MapPublicIpOnLaunch"])
    assert public == sorted(azs) and private == sorted(azs)
    assert len(azs) >= 2


def test_one_nat_gateway_and_an_s3_gateway_endpoint(default):
    template = default.template("network")
    template.resource_count_is("AWS::EC2::NatGateway", 1)
    template.has_resource_properties("AWS::EC2::VPCEndpoint", {
        "VpcEndpointType": "Gateway",
        "ServiceName": Match.object_like({"Fn::Join": ["", Match.array_with([Match.string_like_regexp(r"\.s3$")])]}),
        # every private route table routes S3 through the endpoint
        "RouteTableIds": Match.any_value(),
    })


def test_flow_logs_on(default):
    default.template("network").has_resource_properties("AWS::EC2::FlowLog", {
        "ResourceType": "VPC", "TrafficType": "REJECT", "LogDestinationType": "cloud-watch-logs"})


def test_gpu_nodes_only_in_the_private_subnet_of_the_gpu_az(variant):
    # given one GPU AZ, when the GPU node groups are synthesized, then each lists exactly one
    # subnet, and it is the private subnet in that AZ
    subnets = _subnets(variant)
    exports = _export_to_subnet(variant)
    gpu_az = variant.env.cluster.gpu_availability_zone
    gpu_groups = {k: v for k, v in variant.resources("cluster", "AWS::EKS::Nodegroup").items()
                  if v["Properties"]["AmiType"] == "AL2023_x86_64_NVIDIA"}
    assert len(gpu_groups) == len(variant.env.gpu_node_groups)
    for group in gpu_groups.values():
        listed = group["Properties"]["Subnets"]
        assert len(listed) == 1
        subnet = subnets[exports[listed[0]["Fn::ImportValue"]]]["Properties"]
        assert subnet["AvailabilityZone"] == gpu_az
        assert subnet["MapPublicIpOnLaunch"] is False
