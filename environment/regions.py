"""AWS Regions a spec may name: a well-formed typo (``us-east-3``) is refused here, not by
CloudFormation after the network stack is half deployed.

Source: AWS's published Region list, "AWS Regions" and "AWS Region billing codes" in the AWS
Global Infrastructure documentation (docs.aws.amazon.com/global-infrastructure/latest/regions/
aws-regions.html), as of 2025-12. Add a line when AWS opens a Region; nothing else changes.
"""
from __future__ import annotations

AWS_REGIONS: tuple[str, ...] = (
    # North America
    "us-east-1", "us-east-2", "us-west-1", "us-west-2", "ca-central-1", "ca-west-1", "mx-central-1",
    # Africa
    "af-south-1",
    # Asia Pacific
    "ap-east-1", "ap-east-2", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-south-1",
    "ap-south-2", "ap-southeast-1", "ap-southeast-2", "ap-southeast-3", "ap-southeast-4",
    "ap-southeast-5", "ap-southeast-6", "ap-southeast-7",
    # Europe
    "eu-central-1", "eu-central-2", "eu-north-1", "eu-south-1", "eu-south-2", "eu-west-1", "eu-west-2",
    "eu-west-3",
    # Middle East
    "il-central-1", "me-central-1", "me-south-1",
    # South America
    "sa-east-1",
    # AWS GovCloud (US) and China: other partitions (arn:aws-us-gov, arn:aws-cn)
    "us-gov-east-1", "us-gov-west-1", "cn-north-1", "cn-northwest-1",
)
