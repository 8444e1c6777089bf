"""ONE moto S3 server per test session, on 127.0.0.1, standing in for the checkpoint bucket.

Use it from tests/conftest.py (for everyone) or from a test module with::

    from fixtures_s3 import s3_bucket, s3_server  # noqa: F401  (pytest puts tests/ on sys.path)

Importing it in several places still starts ONE server (a module-level singleton). A session
Ray cluster must be started AFTER the server, with ``s3_server.ray_env_vars`` in
``ray.init(runtime_env={"env_vars": ...})``: Ray Train's controller (it deletes old
checkpoints) and the workers need the endpoint too.

Fixtures:
- ``s3_server`` (session): starts moto's S3 server (the app and werkzeug server
  ``moto.server.ThreadedMotoServer`` runs, behind devtools/slow_store.py's layer, unthrottled
  until a test holds a checkpoint's upload with ``s3_server.store.slowed``) on a free loopback port and
  sets ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
  ``AWS_DEFAULT_REGION`` (and ``AWS_REGION``) in ``os.environ`` for the rest of the session
  (the server stops at exit), so boto3,
  pyarrow and Ray's storage all talk to it; yields an :class:`S3Server`. Ray workers get the same
  variables when the session's Ray cluster is started after this fixture, or through
  ``S3Server.ray_env_vars`` in ``runtime_env={"env_vars": ...}``.
- ``s3_bucket`` (session): the bucket ``raytrain-test`` created on that server; yields
  ``s3://raytrain-test``. Tests put their runs under a unique prefix (``tmp_path.name``).

moto keeps objects in memory for the whole session: keep models tiny.
"""
from __future__ import annotations

import atexit
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

BUCKET = "raytrain-test"
REGION = "us-east-1"


@dataclass(frozen=True, kw_only=True, slots=True)
class S3Server:
    """A running moto server and the environment that points clients at it."""

    endpoint_url: str
    """``http://127.0.0.1:<port>``."""
    ray_env_vars: dict[str, str]
    """The variables to pass to Ray workers (``runtime_env={"env_vars": ...}``)."""
    store: Any = None
    """The :class:`devtools.slow_store.SlowStore` serving it: ``store.slowed(rate, only=...)``
    holds a checkpoint's upload (devtools/strike.py)."""


_RUNNING: list[S3Server] = []


def start_s3_server() -> S3Server:
    """Start the session's server once (later calls return the same one) and export its env.

    A singleton rather than plain fixture state: when two modules import these fixtures
    (conftest and a test module), pytest sees two fixture definitions; both land here.
    """
    if _RUNNING:
        os.environ.update(_RUNNING[0].ray_env_vars)
        return _RUNNING[0]
    from devtools.slow_store import slow_store

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    serving = slow_store(None)
    store = serving.__enter__()
    atexit.register(serving.__exit__, None, None, None)
    env = {
        "AWS_ENDPOINT_URL": store.endpoint_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",  # never look for instance credentials
    }
    os.environ.update(env)
    _RUNNING.append(S3Server(endpoint_url=env["AWS_ENDPOINT_URL"], ray_env_vars=dict(env), store=store))
    return _RUNNING[0]


SESSION_S3_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                        "AWS_REGION", "AWS_EC2_METADATA_DISABLED")
"""What :func:`start_s3_server` exports into ``os.environ`` for the rest of the session."""


@pytest.fixture
def no_session_s3(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test whose outcome must not depend on whether an earlier test started the session's
    moto server (its variables stay in ``os.environ``): without them, the preflight's S3 checks
    see no endpoint, as on a machine with no AWS access, whatever ran before."""
    for name in SESSION_S3_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    yield start_s3_server()


@pytest.fixture(scope="session")
def s3_bucket(s3_server: S3Server) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_server.endpoint_url, region_name=REGION)
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if BUCKET not in existing:
        client.create_bucket(Bucket=BUCKET)
    return f"s3://{BUCKET}"
