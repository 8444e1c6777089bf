"""The session's shared Ray cluster survives what an earlier test in the same process did
(tests/ray_session.py): here, a process left in Ray's token-authentication mode, as a test that
talked to a token-authenticated local head in-process leaves it (ray 2.58 reads ``RAY_AUTH_MODE``
once per process). Seen in CI: every actor the pytest worker created afterwards died at once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

TESTS = Path(__file__).resolve().parent

SCRIPT = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
# What a client of a token-authenticated head leaves behind: Ray's auth mode read (and kept) while
# the head's client environment was set, the environment restored afterwards.
os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="t" * 32)
from ray._raylet import get_authentication_mode
get_authentication_mode()
del os.environ["RAY_AUTH_MODE"], os.environ["RAY_AUTH_TOKEN"]

import ray

@ray.remote(num_cpus=0)
class Echo:
    def ping(self):
        return "pong"

def call():
    try:
        return ray.get(Echo.remote().ping.remote(), timeout=600)
    except Exception as err:
        return type(err).__name__

if sys.argv[2] == "plain":
    ray.init(address="local", num_cpus=1, include_dashboard=False)  # as the fixture did before
else:
    from ray_session import start_session_cluster
    start_session_cluster(ray, num_cpus=1)
print(json.dumps(call()))
ray.shutdown()
"""


def _actor_call(start: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(TESTS), start], env=env,
                         capture_output=True, text=True, timeout=900, cwd=TESTS.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_shared_cluster_works_in_a_process_left_in_token_mode():
    assert _actor_call("session") == "pong"


def test_without_it_every_actor_of_that_process_dies_at_once():
    """The hazard, in the pinned Ray: the cluster as the fixture used to start it."""
    assert _actor_call("plain") == "ActorDiedError"
