"""Fixtures for the pipeline tests: a real registry with images pushed (see oci_registry.py) and
moto's server on 127.0.0.1 for SSM, DynamoDB and CodePipeline."""
from __future__ import annotations

import json
import re
from pathlib import Path

import boto3

import pytest

from oci_registry import OCI_MANIFEST, REGISTRY_BINARY, LocalRegistry, start_registry, stop


@pytest.fixture(scope="session")
def registry(tmp_path_factory) -> LocalRegistry:
    """One real registry for the whole session (started in ~0.2 s)."""
    if REGISTRY_BINARY is None:
        pytest.fail("docker-registry is not installed: run scripts/install-system-deps.sh")
    workdir = tmp_path_factory.mktemp("registry")
    proc, url = start_registry(workdir)
    yield LocalRegistry(url=url, data_dir=workdir / "data")
    stop(proc)


@pytest.fixture(scope="session")
def pushed(registry) -> dict[str, str]:
    """Images pushed once per session: {label: digest}."""
    name = "deep-learning-containers/ray"
    amd64 = registry.push_image("deep-learning-containers/ray", "arch-amd64", content=b"amd64\n",
                                media_type=OCI_MANIFEST)
    arm64 = registry.push_image(name, "arch-arm64", content=b"arm64\n", media_type=OCI_MANIFEST)
    sizes = {d: registry.manifest_size(name, d, OCI_MANIFEST) for d in (amd64, arm64)}
    return {
        "v1": registry.push_image(name, "train-ml-cuda-v1.1.0", content=b"v1\n"),
        "multi": registry.push_index(name, "train-ml-cuda-multi",
                                     {"amd64": (amd64, sizes[amd64]), "arm64": (arm64, sizes[arm64])}),
        "amd64": amd64,
        "arm64": arm64,
    }


@pytest.fixture
def spec_file(tmp_path, registry) -> Path:
    """A copy of the repository's environment.toml whose image lives in the local registry,
    unlocked (the committed spec may be locked: the pipeline's Synth runs these tests)."""
    source = Path(__file__).resolve().parents[1] / "environment.toml"
    text = re.sub(r'(?m)^digest = "[^"]*"', 'digest = ""', source.read_text()).replace(
        'repository = "public.ecr.aws/deep-learning-containers/ray"',
        f'repository = "{registry.host}/deep-learning-containers/ray"')
    assert registry.host in text
    path = tmp_path / "environment.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def aws(tmp_path_factory) -> dict:
    """moto's server on a free loopback port; returns boto3 client kwargs that point at it."""
    from moto.server import ThreadedMotoServer

    from oci_registry import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1",
           "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    server.stop()


def create_watcher_resources(aws: dict, config) -> None:
    """What the pipeline stack creates for the watcher (a WatcherConfig names them): the promoted
    digest parameter with its placeholder, the history table, and a V2 pipeline with the
    IMAGE_DIGEST variable (moto runs no actions; a pipeline needs two stages and a role
    CodePipeline may assume)."""
    ssm, ddb, cp, iam = (boto3.client(s, **aws) for s in ("ssm", "dynamodb", "codepipeline", "iam"))
    ssm.put_parameter(Name=config.parameter_name, Value="none", Type="String")  # not a digest
    ddb.create_table(TableName=config.table_name, BillingMode="PAY_PER_REQUEST",
                     KeySchema=[{"AttributeName": "image", "KeyType": "HASH"},
                                {"AttributeName": "at", "KeyType": "RANGE"}],
                     AttributeDefinitions=[{"AttributeName": "image", "AttributeType": "S"},
                                           {"AttributeName": "at", "AttributeType": "S"}])
    role = iam.create_role(RoleName=f"role-{config.pipeline_name}", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "codepipeline.amazonaws.com"}}]}))
    action = {"name": "a", "actionTypeId": {"category": "Source", "owner": "AWS", "provider": "S3", "version": "1"},
              "configuration": {"S3Bucket": "b", "S3ObjectKey": "k"}, "outputArtifacts": [{"name": "o"}]}
    cp.create_pipeline(pipeline={
        "name": config.pipeline_name, "roleArn": role["Role"]["Arn"], "pipelineType": "V2",
        "artifactStore": {"type": "S3", "location": "artifacts"},
        "variables": [{"name": "IMAGE_DIGEST", "defaultValue": "spec"}],
        "stages": [{"name": "Source", "actions": [action]},
                   {"name": "Deploy", "actions": [dict(action, name="b", outputArtifacts=[{"name": "p"}])]}]})
