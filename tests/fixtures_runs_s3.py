"""Fixtures for the run-record and report tests (imported where they are used): moto's S3 server
on loopback (one per session)."""
from __future__ import annotations

import os
import socket

import pytest

FIXTURES_DIR = os.path.join(os.path.dirname(__file__), "fixtures")


@pytest.fixture(scope="session")
def _moto_server():
    from moto.server import ThreadedMotoServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def moto_s3(_moto_server, monkeypatch):
    """S3 on moto with bucket ``runs-111122223333``; the environment points pyarrow/boto3 at it."""
    env = {"AWS_ENDPOINT_URL": _moto_server, "AWS_ENDPOINT_URL_S3": _moto_server,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    import boto3

    client = boto3.client("s3", endpoint_url=_moto_server, region_name="us-east-1")
    try:
        client.create_bucket(Bucket="runs-111122223333")
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    return _moto_server
