"""The local Ray head runs with token auth, as the RayClusters on EKS do: `ray job submit`
without the token is refused, with the head's token (what KubeRay injects into its submitter)
it runs the job. Its workers find their own head's state API while another Ray instance runs
on the machine. The head is the session's warm one (tests/conftest.py ``warm_head``: ``python -m
raytrain_eks.backends.warm_head``, the same ``ray_head`` a submit starts), whose stop the fixture
checks; each job here is a Ray job of its own on it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ray_session import AWS_SESSION_CANARY
from raytrain_eks.backends.local_services import LOCAL_CPUS
from raytrain_eks.backends.warm_head import LOCAL_HEAD_ENV
from raytrain_eks.backends.local_services import RayHead, head_processes

pytestmark = pytest.mark.slow  # runs jobs on a Ray head
RAY = str(Path(sys.executable).with_name("ray"))


def submit(head, env: dict[str, str], code: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return subprocess.run([RAY, "job", "submit", "--address", head.dashboard_url, "--", sys.executable, "-c", code],
                          env={**clean, **env}, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def head(warm_head):
    """The session's warm head, while another "Ray instance" runs on the machine: a process that
    looks like a raylet to Ray's own scan of local processes (ray 2.58
    ``_private/services.py`` ``_find_address_from_flag``/``_is_raylet_process``: the executable's
    name contains "raylet" and its command line has ``--gcs-address=``)."""
    named = json.loads(Path(warm_head[LOCAL_HEAD_ENV]).read_text())
    decoy = subprocess.Popen(["raylet", "-c", "import time; time.sleep(900)", "--gcs-address=127.0.0.1:9"],
                             executable=sys.executable)
    try:
        yield RayHead(gcs_address=named["gcs_address"], dashboard_url=named["dashboard_url"],
                      temp_dir=named["temp_dir"], metrics_url=named["metrics_url"], auth_token=named["auth_token"])
    finally:
        decoy.kill()
        decoy.wait()


def test_the_heads_processes_are_found_those_that_renamed_themselves_included(head):
    """The head's processes as :func:`head_processes` finds them (the warm head's stop kills
    exactly these): its daemons, and those that renamed themselves and name neither its temp dir
    nor its GCS address any more (the agents and workers, ray::...; the dashboard's modules,
    ray-dashboard-...)."""
    tree = head_processes(head.temp_dir, head.gcs_address)
    commands = [Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace") for pid in tree]
    assert any(c.startswith("ray::DashboardAgent") for c in commands), commands
    assert any(c.startswith("ray-dashboard-JobHead") for c in commands), commands


def test_local_head_requires_the_token_and_accepts_it(head):
    assert head.client_env["RAY_AUTH_MODE"] == "token" and len(head.client_env["RAY_AUTH_TOKEN"]) == 64
    # the job API refuses a request without the token (401), even from loopback
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{head.dashboard_url}/api/jobs/", timeout=120)
    assert refused.value.code == 401
    # a client that does not know the token is refused, a client with it runs the job
    # (whose driver and workers reach the GCS with the token they inherit)
    code = "import ray; ray.init(); print('auth-ok', ray.cluster_resources()['CPU'])"
    denied = submit(head, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}, code)
    assert denied.returncode != 0
    allowed = submit(head, head.client_env, code)
    assert allowed.returncode == 0, allowed.stdout[-2000:] + allowed.stderr[-2000:]
    assert f"auth-ok {float(LOCAL_CPUS)}" in allowed.stdout
    # the head's token is given to Ray in RAY_AUTH_TOKEN, never written to the user's token file
    # (a file left there by the user's own Ray is theirs: only this head's token in it is a leak)
    users_file = Path.home() / ".ray" / "auth_token"
    assert not users_file.exists() or head.auth_token not in users_file.read_text(errors="replace")


def test_workers_reach_their_own_heads_state_api_beside_another_ray_instance(head):
    """Ray Train's PlacementGroupCleaner actor asks the state API for the controller's state with
    no address (ray 2.58 ``train/v2/_internal/execution/controller/placement_group_cleaner.py``
    -> ``util/state/api.py`` ``StateApiClient`` -> ``dashboard/utils.py``
    ``get_address_for_submission_client(None)``). With neither ``RAY_API_SERVER_ADDRESS`` nor
    ``RAY_ADDRESS`` set, that scans the machine's raylets (``canonicalize_bootstrap_address_or_die``:
    the head's cluster file is in its own temp dir, so it is not "the latest ``ray start``") and
    raises "Found multiple active Ray instances" while a second one runs (the decoy here; a demo
    beside a test run on a real machine). The task runs that same upstream function."""
    code = ("import ray; from ray.dashboard.utils import get_address_for_submission_client as api; ray.init(); "
            "print('state-api', ray.get(ray.remote(lambda: api(None)).remote()))")
    done = submit(head, head.client_env, code)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"state-api {head.dashboard_url}" in done.stdout


def test_the_users_aws_session_token_stays_out_of_rays_files(head):
    """Ray writes its processes' environments into files under its temp dir (readable by other
    users of the machine). A local run talks to moto only: the user's AWS credentials never
    reach the head, so none of its files holds the session token."""
    code = "import os; print('token' if os.environ.get('AWS_SESSION_TOKEN') else 'none')"
    done = submit(head, head.client_env, code)
    assert done.returncode == 0 and "none" in done.stdout, done.stdout + done.stderr
    leaked = [str(p) for p in Path(head.temp_dir).rglob("*") if p.is_file() and not p.is_symlink()
              and AWS_SESSION_CANARY.encode() in p.read_bytes()]
    assert leaked == []


def test_the_heads_raylet_prestarts_no_workers(head):
    """The local head starts Python workers only when a lease needs one (``NO_PRESTART``,
    docs/submit.md): its raylet runs with both of Ray's prestart settings off. They are RayConfig
    names the raylet reads from its own environment (``RAY_<name>``; ray 2.58 ``ray_config.h``), so
    the raylet's environment is where they must be."""
    from raytrain_eks.backends.local_services import NO_PRESTART

    tree = head_processes(head.temp_dir, head.gcs_address)
    commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in tree}
    [raylet] = [pid for pid, argv in commands.items() if argv[0].endswith(b"/raylet")]
    environ = dict(line.split(b"=", 1) for line in Path(f"/proc/{raylet}/environ").read_bytes().split(b"\0") if b"=" in line)
    assert {key: environ.get(key.encode(), b"").decode() for key in NO_PRESTART} == NO_PRESTART
    assert NO_PRESTART == {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}
