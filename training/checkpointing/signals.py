"""SIGTERM -> "stop after a final checkpoint", in the workers and forwarded by the driver.

Three ways a stop request reaches a worker; :func:`stop_requested` is True after any of them:
- SIGTERM to the worker process itself. Python lets only the MAIN thread install handlers, and
  Ray Train runs the training function in a side thread while the actor's main thread idles in
  Ray's task loop: :func:`install_worker_handler` therefore runs ``signal.signal`` as a task on
  the worker's own actor (plain actors execute tasks on the main thread). Ray's own handler would
  exit at once; ours only sets a flag, and a watchdog exits the process if the final checkpoint
  overruns ``grace_seconds``.
- SIGTERM to the driver: :func:`forward_driver_sigterm` sets a flag in a named actor that every
  worker watches without blocking (one pending ``ray.wait`` with timeout 0 per step).
The manager all-reduces the flag, so every rank checkpoints at the same step.

A node drain is not a stop: Ray Core drains a node with a deadline (a spot reclaim's notice
reaches it when the managed node group evicts the Ray pod and ``ray start`` drains its node;
``ray drain-node`` and the autoscaler send the same GCS DrainNode), Ray Train's PreemptionWatcher
sees it and marks every worker (``ray/train/v2/_internal/execution/preemption.py``), and
:func:`preemption_notice` reads that mark without a barrier. The manager then commits a
checkpoint at the step boundary and holds until Ray Train restarts the run on what is left.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

log = logging.getLogger(__name__)

_STOP = threading.Event()
_watch: dict[str, Any] = {}
_driver: dict[str, threading.Event] = {}
"""The driver's stop event (:func:`forward_driver_sigterm`): a SIGTERM or the run's own time limit sets it."""
_overrun_timer: list[threading.Timer] = []
"""The grace-period watchdog of a SIGTERM, cancelled once the final checkpoint is written."""


def stop_requested() -> bool:
    """True once this process was asked to stop (SIGTERM, driver forward)."""
    if _STOP.is_set():
        return True
    ref = _watch.get("ref")
    if ref is not None:
        import ray

        ready, _ = ray.wait([ref], timeout=0)
        if ready and _flag_fired(ref):
            log.warning("stop forwarded by the driver")
            _STOP.set()
    return _STOP.is_set()


def _flag_fired(ref: Any) -> bool:
    """The driver's flag resolved: True when it was set; a flag actor that DIED (its node lost)
    resolves its pending ``wait()`` with an error, which is no stop request. The watch is then
    dropped (the driver's flag is gone with it) instead of stopping every rank."""
    import ray

    try:
        return bool(ray.get(ref, timeout=0))
    except Exception as err:  # noqa: BLE001 - RayActorError and friends: the flag, not the run, is gone
        log.warning("the driver's stop flag is gone (%s): no stop requested", type(err).__name__)
        _watch.pop("ref", None)
        return False


def request_stop() -> None:
    """Ask this process to stop after a final checkpoint (what the handler does)."""
    _STOP.set()


def final_checkpoint_written() -> None:
    """The final checkpoint after a stop request is complete: the grace-period watchdog must
    not kill this process later (a Ray worker outlives its training function)."""
    while _overrun_timer:
        _overrun_timer.pop().cancel()


def reset() -> None:
    """Forget a stop request (tests; a restarted worker starts clean anyway)."""
    final_checkpoint_written()
    _STOP.clear()
    _watch.clear()


def _handle_sigterm(signum: int, frame: Any, grace_seconds: float) -> None:
    if _STOP.is_set():
        return
    _STOP.set()
    log.warning("SIGTERM: final checkpoint, then exit (at most %.0f s)", grace_seconds)

    def _overrun() -> None:
        log.error("final checkpoint did not finish within %.0f s of SIGTERM: exiting", grace_seconds)
        os._exit(143)

    timer = threading.Timer(grace_seconds, _overrun)
    timer.daemon = True
    timer.start()
    _overrun_timer.append(timer)


def install_handler(grace_seconds: float) -> None:
    """Install the flag-setting SIGTERM handler; must run on the main thread."""
    signal.signal(signal.SIGTERM, lambda s, f: _handle_sigterm(s, f, grace_seconds))


def install_worker_handler(grace_seconds: float, run_name: str = "") -> None:
    """From the training function: install the handler on this worker's main thread and watch
    the driver's stop flag for ``run_name`` (when the driver created one)."""
    import ray

    if threading.current_thread() is threading.main_thread():
        install_handler(grace_seconds)
    else:
        actor = ray.get_runtime_context().current_actor
        ray.get(actor.execute.remote(install_handler, grace_seconds))
    if run_name:
        watch_driver_flag(run_name)


def watch_driver_flag(run_name: str) -> bool:
    """Watch the driver's stop flag for ``run_name``; False when the driver made none."""
    import ray

    try:
        flag = ray.get_actor(_flag_name(run_name), namespace=_NAMESPACE)
    except ValueError:
        return False  # e.g. a test that starts the trainer directly
    _watch["ref"] = flag.wait.remote()
    return True


def preemption_notice() -> Any:
    """Ray Train's ``PreemptionInfo`` for this worker (a node of the run is draining: its
    ``preempted_node_to_ranks`` and ``deadline_ms``), or None. Read from the worker's own
    preemption context, which the PreemptionWatcher's ``mark_preempt`` sets (ray 2.58
    ``train/v2/_internal/execution/context.py``): the public ``ray.train.get_preemption_info()``
    is a barrier across the workers, this is not; the manager agrees on it in its own all-reduce."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        return get_train_context().preemption_context.preemption_info
    except Exception:  # outside a Ray Train worker
        return None


_NAMESPACE = "raytrain-eks"


def _flag_name(run_name: str) -> str:
    return f"stop-{run_name}"


def _stop_flag_class() -> Any:
    import asyncio

    import ray

    @ray.remote(num_cpus=0)
    class StopFlag:
        """Set once by the driver; workers hold a pending ``wait()`` that resolves then."""

        def __init__(self) -> None:
            self._event = asyncio.Event()

        async def wait(self) -> bool:
            await self._event.wait()
            return True

        async def set(self) -> None:
            self._event.set()

    return StopFlag


def forward_driver_sigterm(run_name: str, grace_seconds: float) -> Any:
    """In the driver, before ``trainer.fit()``: on SIGTERM, tell every worker to stop.

    Returns the flag actor (keep a reference for the run's lifetime). The handler itself only
    sets an event; a helper thread talks to Ray (no Ray calls inside a signal handler).
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # On the driver's own node: on another node, losing that node killed the flag, and every
    # rank read its death as a stop (found by tests/e2e/test_chaos.py's lost node).
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    flag = _stop_flag_class().options(name=_flag_name(run_name), namespace=_NAMESPACE, get_if_exists=True,
                                      lifetime=None, scheduling_strategy=here).remote()
    fired = threading.Event()

    def _forward() -> None:
        fired.wait()
        log.warning("driver got SIGTERM: asking workers for a final checkpoint (grace %.0f s)", grace_seconds)
        flag.set.remote()

    threading.Thread(target=_forward, name="sigterm-forward", daemon=True).start()
    signal.signal(signal.SIGTERM, lambda s, f: fired.set())
    _driver["fired"] = fired
    _driver.pop("time_limit", None)  # a new run: its own limit has not fired yet
    return flag


def stop_was_requested() -> bool:
    """True once this driver asked its workers to stop (a SIGTERM, or its own time limit): the
    progress watchdog stands down while they write their final checkpoint."""
    fired = _driver.get("fired")
    return fired is not None and fired.is_set()


def time_limit_reached() -> bool:
    """True once :func:`stop_driver_after` has fired in this driver: its stop is the run's planned end."""
    return "time_limit" in _driver


def stop_driver_after(seconds: float, why: str) -> threading.Timer:
    """After :func:`forward_driver_sigterm`: ask every worker for a final checkpoint after
    ``seconds``, as a SIGTERM would (the run's own wall-clock limit). Cancel the returned timer
    when the run ends first."""
    fired = _driver["fired"]

    def _fire() -> None:
        log.warning("%s: final checkpoint, then exit", why)
        _driver["time_limit"] = fired
        fired.set()

    timer = threading.Timer(seconds, _fire)
    timer.daemon = True
    timer.start()
    return timer
