"""Shared fixtures: a tiny Qwen2 config, ONE local Ray cluster, ONE warm local head and ONE local
run per test session.

Every ``TorchTrainer.fit`` costs ~20-30 s of start-up on 2 cores, and ``ray.init`` itself a few
seconds more: tests that need Ray take ``ray_cluster`` and share the same one. Tests that only
read what a run left (its record, metrics, report, model, MLflow run, network figures) take
``local_run``: one ``raytrain-eks submit jobs/local.toml --local`` for all of them
(tests/shared_run.py). A ``submit --local`` whose test is not about the head's own start and stop
takes ``warm_head``: its job goes to the session's one warm head, a Ray job of its own.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ray_session import AWS_SESSION_CANARY, TEST_ENV
from session_services import release_unneeded, released_when_unneeded
from shared_run import submit_local
from tiers import mark_tiers, unit_guard
from tiny_qwen import TINY_VOCAB, tiny_qwen2_config  # noqa: F401  (re-exported)
from tracking_venv import TRACKING_PYTHON, mlflow_server

ROOT = Path(__file__).resolve().parents[1]

# One intra-op thread per test process and every process it starts (ranks, CLIs, Ray heads), as
# Ray gives a worker of one CPU (ray 2.58 ``_private/utils.py`` ``set_omp_num_threads_if_unset``):
# `make test` runs one pytest worker per core, and torch's default of a thread per core made each
# tiny step contend with the other worker's (a step of 4-7 s against 0.35 s with one thread, on a
# loaded machine). Set before any test module imports torch; a value the caller set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After ``item``'s own fixtures are torn down, stop each session service no later test of
    this process takes (tests/session_services.py ``needed_from``: whatever a process runs from ``nextitem`` on lies
    at or after the first item of ``nextitem``'s unit of work in ``session.items``). ``nextitem``
    None (the end of what xdist has sent so far) releases nothing: the session's end does. A
    service's own end checks (the warm head's) fail as an error in this teardown."""
    torn_down = yield
    if nextitem is not None:
        release_unneeded(item.session, nextitem)
    return torn_down


@pytest.fixture
def tiny_qwen2():
    """A tiny Qwen2 config (dict of Qwen2Config kwargs) with a small vocabulary."""
    return tiny_qwen2_config()


@pytest.fixture
def one_rank_group(tmp_path):
    """A one-rank gloo process group for the test, destroyed after it: a group left behind makes
    the next test in the same xdist worker that starts one fail ("trying to initialize the
    default process group twice")."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'one-rank-group'}")
    yield dist
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the whole session (4 logical CPUs; no dashboard), started so no
    earlier test in this process can break it (tests/ray_session.py). It starts after the
    session's moto server (tests/fixtures_s3.py), whose variables its processes inherit: a run's
    Ray Train controller writes its snapshot to that store, whichever test started the cluster."""
    ray = pytest.importorskip("ray")
    from fixtures_s3 import start_s3_server
    from ray_session import start_session_cluster

    with released_when_unneeded("ray_cluster") as stack:
        if not ray.is_initialized():
            start_s3_server()
            start_session_cluster(ray)
        stack.callback(ray.shutdown)
        yield ray


@pytest.fixture(scope="session")
def warm_head(tmp_path_factory) -> dict[str, str]:
    """The environment of a ``submit --local`` onto the session's ONE warm local head: ``python -m
    raytrain_eks.backends.warm_head FILE``, as a user keeps one (a token-authenticated Ray head and
    moto's S3 server), reached with ``RAYTRAIN_LOCAL_HEAD=FILE``; each run on it is a Ray job of
    its own through the head's job supervisor. A run that must start and stop its own head (the
    shared ``local_run``, a fault set on the cluster, a signal to the submit) does not take it.
    It is started from a shell holding the user's AWS session (:data:`AWS_SESSION_CANARY`), which
    must reach none of its processes (tests/raytrain_eks/backends/test_local_ray_auth.py). At the
    end it is stopped as a user stops it (SIGTERM): exit 130, its file gone, none of its processes
    left: those naming its temp dir or its S3 server's port, and every process of the head's tree,
    the ones that renamed themselves (``ray::...``, ``ray-dashboard-...``) included."""
    with released_when_unneeded("warm_head") as stack:
        yield stack.enter_context(_warm_head(tmp_path_factory.mktemp("warm-head")))


@contextlib.contextmanager
def _warm_head(folder: Path):
    """The warm head of :func:`warm_head`, started and, at the end, stopped and checked."""
    from raytrain_eks.backends.warm_head import LOCAL_HEAD_ENV
    from raytrain_eks.backends.local_services import head_processes, processes_matching, running

    path, log = folder / "head.json", (folder / "head.log").open("w")
    shell = {**os.environ, **TEST_ENV, "AWS_SESSION_TOKEN": AWS_SESSION_CANARY, "AWS_PROFILE": "someone"}
    proc = subprocess.Popen([sys.executable, "-m", "raytrain_eks.backends.warm_head", str(path)], cwd=ROOT, env=shell,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    tree: list[int] = []
    try:
        while not path.is_file() and proc.poll() is None:  # the head's own start retries bound this
            time.sleep(0.2)
        assert path.is_file(), f"the warm head did not start: {(folder / 'head.log').read_text()[-3000:]}"
        named = json.loads(path.read_text())
        yield {**os.environ, LOCAL_HEAD_ENV: str(path)}
        tree = head_processes(named["temp_dir"], named["gcs_address"])  # the head's, as it stops
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=600)
        log.close()
    port = named["storage_endpoint"].rsplit(":", 1)[1]
    left = {m: p for m in (named["temp_dir"], f"moto_server -H 127.0.0.1 -p {port} ") if (p := processes_matching(m))}
    assert (code, path.exists(), left, running(tree)) == (130, False, {}, []), (folder / "head.log").read_text()[-3000:]


@pytest.fixture(scope="session")
def local_run_mlflow(tmp_path_factory):
    """The session's real MLflow server: the shared run's driver keeps its MLflow run on it, and
    tests/training/test_tracking_real_run.py its runs (each in an experiment of its own), up until
    no later test takes it (the reads come after the runs; :func:`released_when_unneeded`); "" without ``.work/tracking-venv``: the run
    goes untracked and the tests that read MLflow skip, saying how to make the venv."""
    if not TRACKING_PYTHON.exists():
        yield ""
        return
    with released_when_unneeded("local_run_mlflow") as stack:
        yield stack.enter_context(mlflow_server(tmp_path_factory.mktemp("local-run-mlflow")))


@pytest.fixture(scope="session")
def local_run(tmp_path_factory, local_run_mlflow) -> tuple[Path, subprocess.CompletedProcess]:
    """``(out dir, the finished process)`` of ONE ``raytrain-eks submit jobs/local.toml --local``
    (tests/shared_run.py): moto's S3 server and a real Ray head on 127.0.0.1, the RayJob's own
    entrypoint submitted with ``ray job submit``, the records, report and model copied to the out
    dir (``.work/runs/<run>/``, removed at the end)."""
    out, proc = submit_local(tmp_path_factory.mktemp("user"), local_run_mlflow)
    yield out, proc
    shutil.rmtree(out, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers given here
def pytest_collection_modifyitems(config, items):
    """Each test gets the marker of its tier (``unit``, ``subprocess``, ``synth``, ``ray``; the
    ``ray`` tier also ``slow``, its old name): see tests/tiers.py.

    Then the order: modules that train (ray tier) first, each module kept in one piece (a module
    fixture is set up once), the rest after. In parallel (``-n``) the long units start first
    instead of ending the run alone; see :func:`pytest_xdist_make_scheduler`."""
    mark_tiers(items)
    slow_modules = {item.path for item in items if item.get_closest_marker("ray") is not None}
    shared_run = {item.path for item in items if "local_run" in getattr(item, "fixturenames", ())}
    # the cluster tier's one worker starts its control plane early too, beside the training modules
    plane = {item.path for item in items if item.get_closest_marker("cluster") is not None}
    rank = {path: 0 if path in shared_run or "e2e" in path.parts or path in plane else 1 if path in slow_modules else 2
            for path in {item.path for item in items}}
    items.sort(key=lambda item: rank[item.path])  # stable: the order inside each rank is kept


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """A ``unit`` test's fixtures may start no process and no jsii object (tests/tiers.py)."""
    with unit_guard(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Nor may the test itself."""
    with unit_guard(item):
        yield


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``make test`` runs the suite on every core (pytest-xdist, ``--dist loadgroup``). A unit of
    work is a whole module (its module fixtures are set up once), or every module marked
    ``xdist_group(name)`` together: the modules that read the session's ``local_run`` share one
    worker, so the run is trained once. Units go out in collection order (slow first)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    config.option.loadscopereorder = False  # keep the collection's order (xdist sorts by size)
    from xdist.scheduler import LoadGroupScheduling

    class ModuleOrGroup(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return scope if scope != nodeid else nodeid.split("::", 1)[0]

    return ModuleOrGroup(config, log)
