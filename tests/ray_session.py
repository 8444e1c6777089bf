"""The session's one shared Ray cluster (tests/conftest.py ``ray_cluster``), started so that what
earlier tests did in the same pytest process cannot break it.

Two things an earlier test can leave behind, both read in ray 2.58's own source:

- **A cached authentication mode.** Ray reads ``RAY_AUTH_MODE`` once per process (``RayConfig``,
  behind ``ray._raylet.get_authentication_mode``) and keeps it. A test that talked to one of the
  project's token-authenticated local heads in-process (tests/e2e/test_chaos.py's state-API calls
  with the head's ``client_env`` in ``os.environ``) leaves the process in token mode after the
  variables are gone. A cluster ``ray.init`` then starts has no token, but this driver's own RPC
  server still demands one: the GCS's ``WaitForActorRefDeleted`` poll of the driver is refused,
  and the GCS destroys every actor the driver creates at once (``gcs_actor_manager.cc``: "Worker
  ... failed, destroying actor child"), seen as ``ActorDiedError`` "all references to the actor
  were removed including lineage ref count ... The actor never ran". In such a process the shared
  cluster is started with token authentication and a fresh token of its own
  (``AuthenticationTokenLoader.reset_cache`` re-reads it), so driver and cluster agree.
- **Another worker's ``ray start`` head.** ``ray.init()`` without an address connects to the
  machine's newest ``ray start`` head if one is alive (``_private/services.py``
  ``get_ray_address_from_environment``: ``/tmp/ray/ray_current_cluster``), e.g. the chaos suite's
  in the other xdist worker: ``address="local"`` always starts this session's own.
"""
from __future__ import annotations

import os
import secrets

AWS_SESSION_CANARY = "FQoGZXIvYXdzEXAMPLEsessiontokenNEVERinLOGS"
"""The AWS session token of the shell the session's warm local head is started from
(tests/conftest.py ``warm_head``): no file of the head may hold it."""

TEST_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", "RAY_metrics_report_interval_ms": "1000",
            "RAYTRAIN_HANG_FLOOR_S": "600"}
"""Each ray.train.report waits for a controller poll (2 s by default, ray 2.58
``train/v2/_internal/constants.py`` ``DEFAULT_HEALTH_CHECK_INTERVAL_S``; the controller's
``_poll_workers`` sleeps out the rest of it), and so do the end of a run and a lost worker's
notice: poll fast in tests. Workers push their metrics every 10 s by default: a short test run
could end between two pushes. The progress watchdog's floor (60 s, training/watchdog.py) is
600 s: a test run's sub-second steps on a loaded 2-core machine can stall past 60 s, and a false
hang would add an incident to runs whose record must hold none (or one, the injected fault);
tests/e2e/test_chaos.py, whose injected hang must be declared, sets the production floor itself.
Also given to the tests' local heads (the environment of their
``submit --local``, ``make demo`` and ``ray_head``: the head's processes inherit it, the job's
driver (where the watchdog reads its floor) among them, and the driver forwards what
training/launch.py ``FORWARDED_ENV_PREFIXES`` names, the health-check interval included, to Ray
Train's controller and workers)."""


def agree_on_authentication() -> bool:
    """Give the cluster about to start the authentication mode this process already holds.
    True when that is token mode (a fresh token is set in ``os.environ`` for the cluster, its
    drivers and subprocesses)."""
    from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, get_authentication_mode

    if get_authentication_mode() != AuthenticationMode.TOKEN:
        return False
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    AuthenticationTokenLoader.instance().reset_cache()
    return True


def start_session_cluster(ray, num_cpus: int = 4) -> None:
    """``ray.init`` of this session's own local cluster (no dashboard), retried as the product's
    local heads are when a loaded machine misses Ray's fixed raylet-registration wait."""
    from raytrain_eks.backends.local_services import NO_PRESTART, ServiceStartError, free_port, start_with_retries

    for key, value in TEST_ENV.items():
        os.environ.setdefault(key, value)  # before ray.init: every Ray process inherits it
    # The autoscaler's metrics server defaults to one fixed port (AUTOSCALER_METRIC_PORT, 44217):
    # a second test process's cluster would fail to bind it.
    os.environ.setdefault("AUTOSCALER_METRIC_PORT", str(free_port()))
    # ray.init's wait for the GCS port is 30 s by default (ray 2.58 _private/node.py, honouring
    # RAY_gcs_server_port_wait_time_s): give it the time a loaded machine needs.
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "300")
    # No workers started ahead of demand, as on the product's heads (local_services.NO_PRESTART):
    # those started at the driver's registration idled where no task came (docs/testing.md).
    for key, value in NO_PRESTART.items():
        os.environ.setdefault(key, value)
    agree_on_authentication()

    def start(attempt: int) -> None:
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=True,
                     runtime_env={"env_vars": dict(TEST_ENV)})
        except Exception as err:  # ray.init raises a bare Exception on its startup timeout
            ray.shutdown()
            raise ServiceStartError(f"ray.init: {err}") from err

    start_with_retries(start, "the session's Ray cluster")
