"""The local Ray head runs with token auth, as the RayClusters on EKS do: `ray job submit`
without the token is refused, with the head's token (what KubeRay injects into its submitter)
it runs the job."""
from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from devtools.local_services import processes_matching, ray_head

pytestmark = pytest.mark.slow  # starts a Ray head
RAY = str(Path(sys.executable).with_name("ray"))


def submit(head, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return subprocess.run([RAY, "job", "submit", "--address", head.dashboard_url, "--",
                           sys.executable, "-c", "import ray; ray.init(); print('auth-ok', ray.cluster_resources()['CPU'])"],
                          env={**clean, **env}, capture_output=True, text=True, timeout=600)


def test_local_head_requires_the_token_and_accepts_it(tmp_path):
    with ray_head(num_cpus=1) as head:
        assert head.client_env["RAY_AUTH_MODE"] == "token" and len(head.client_env["RAY_AUTH_TOKEN"]) == 64
        # the job API refuses a request without the token (401), even from loopback
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{head.dashboard_url}/api/jobs/", timeout=10)
        assert refused.value.code == 401
        # a client that does not know the token is refused, a client with it runs the job
        # (whose driver and workers reach the GCS with the token they inherit)
        denied = submit(head, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64})
        assert denied.returncode != 0
        allowed = submit(head, head.client_env)
        assert allowed.returncode == 0, allowed.stdout[-2000:] + allowed.stderr[-2000:]
        assert "auth-ok 1.0" in allowed.stdout
        temp_dir = head.temp_dir
    assert processes_matching(temp_dir) == []
    assert not (Path.home() / ".ray" / "auth_token").exists() or "RAY_AUTH_TOKEN" in os.environ
