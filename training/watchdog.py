"""The progress watchdog: a run that stops making steps is declared hung, diagnosed, torn down
and resumed from its last checkpoint within minutes, and every fault lands in run.json.

Why: Ray Train notices a dead worker at its next poll (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``,
2 s), but a LIVE worker that makes no progress (frozen, stuck in a collective whose peer is
gone, a kernel or NCCL call that never returns while the process still answers) only after
its health check times out (``RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S``, 600 s by default, ray
2.58 ``train/v2/_internal/constants.py``; and a rank stuck inside CUDA or NCCL can still answer
the check), or after the collective timeout (``training.launch.COLLECTIVE_TIMEOUT_S``). Every
GPU of the job idles meanwhile. Ray's health check stays as the backstop.

The parts, none inside a rank's training thread:

- ``_Board``, an actor on the driver's node (0 CPUs). Every rank registers at worker start,
  before its model build (pid, node, where its stack dump goes; no step yet), says the step it
  restored once its restore is done (:meth:`Progress.started`) and reports each step as it
  finishes: one fire-and-forget actor call each, no wait.
- :class:`FailureNotes`, a Ray Train ``UserCallback`` on the controller: the errors Ray Train
  itself saw (a dead worker, a failed or timed-out health check, an exception) reach the board
  with their ranks, before the controller restarts the group.
- :class:`Watchdog`, a thread of the driver: it reads the board every :data:`POLL_S` and
  records each fault as an incident (training/incidents.py, which also names the fault from
  Ray's record: why a worker died, :func:`training.incidents.name_fault`) in run.json, completed with the
  step the next attempt resumed from and the time and GPU-minutes lost. When no rank finished a
  step within :func:`hang_bound`, or when :data:`FIRST_STEP_S` after the attempt started some
  rank has no step yet (stuck in its build, data open or restore) or never registered, it
  declares a hang: on every registered rank's node at once (one :data:`PROBE_TIMEOUT_S` for all)
  it saves the rank's Python stack (the
  rank installed ``faulthandler`` on SIGUSR1 into a file on its node: a task on that node
  sends the signal and reads the file, so a rank whose training thread holds the GIL in native
  code still dumps), reads each process's state (``/proc/<pid>/stat``: ``T`` = stopped), names
  the rank(s) and node(s) that did not progress (a rank that never registered by number),
  copies the stacks (and, on GPU, NCCL's flight-recorder dumps, :func:`flight_recorder_env`)
  into ``<run>/incidents/``, and SIGKILLs the ranks it named whose node answered the probe (a
  rank that never registered has no pid: the registered ranks waiting on it are killed; a
  rank whose node gave no answer is recorded as such, and Ray's health check remains its
  backstop). Ray Train sees the dead worker at its next poll, tears the whole group
  down and restarts it from the last checkpoint (``checkpoint.max_failures``).

The health gate (training/health_gate.py) reports a node that failed it to the same board, which
records it as a ``health_gate`` incident.

The bound (:func:`hang_bound`): ``max(STEP_MULTIPLE x measured step time, FLOOR_S)``; when the
step due next also evaluates or checkpoints, the longest such step measured in the attempt takes
the step time's place, and before one was measured ``EVENT_FLOOR_S`` is added; before an attempt has
measured two steps, :data:`FIRST_STEP_S` (model build, restore, the evaluation before training
and the first compile), counted from the last rank's restore; and until every rank has restored,
:data:`FIRST_STEP_S` from the attempt's first registration. The watchdog stands down once the last step is done (evaluation and
export run after it: Ray's health check covers them) and after a stop was requested.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import statistics
import threading
import time
from typing import Any

from training import contract, incidents
from training.health_gate import GateFailed

log = logging.getLogger(__name__)

STEP_MULTIPLE = 3.0
"""A step three times slower than the run's own median is no longer noise (a checkpoint, a GC
pause and a slow batch fit in it)."""
FLOOR_S = 60.0
"""The least time without a step before a hang is declared (:data:`contract.ENV_HANG_FLOOR_S`
overrides): a tiny model's sub-second steps must not make a scheduler hiccup a hang."""
EVENT_FLOOR_S = 300.0
"""The extra time for a step that evaluates or checkpoints before the attempt measured such a
step (``ENV_HANG_FLOOR_S`` also overrides it): a 7B model's evaluation or checkpoint snapshot
takes minutes on a slow node."""
FIRST_STEP_S = 900.0
"""The bound for an attempt's first steps (:data:`contract.ENV_HANG_FIRST_STEP_S` overrides):
the model build, the restore from storage, the evaluation before training and the first compile
come before them; the preflight's step time says nothing of those."""
POLL_S = 2.0
"""How often the driver reads the board (Ray Train polls its workers as often)."""
PROBE_TIMEOUT_S = 20.0
"""How long the stack probe of one rank may take (a task on its node); a node that does not
answer within it is named as not answering."""
DUMP_WAIT_S = 2.0
"""How long the probe waits for faulthandler to write after the signal."""
STACK_SIGNAL = signal.SIGUSR1
"""The signal each rank's faulthandler answers with every thread's Python stack. Unused by Ray
Train's workers (ray 2.58: only Tune's driver and Serve's proxy install SIGUSR1 handlers)."""
NAMESPACE = "raytrain-eks"
INCIDENTS_DIR = "incidents"
"""``<run>/incidents/<n>-<kind>/``: what a hang saved (stacks, flight-recorder dumps)."""
FLIGHT_RECORDER_PREFIX = "nccl_trace_rank_"
NO_ANSWER = "no answer"
"""A probe's process state when its node's task did not answer within :data:`PROBE_TIMEOUT_S`."""


def board_name(run_name: str) -> str:
    return f"progress-{run_name}"


def _env_float(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


def floors() -> tuple[float, float, float]:
    """``(FLOOR_S, EVENT_FLOOR_S, FIRST_STEP_S)`` with the environment's overrides."""
    floor = _env_float(contract.ENV_HANG_FLOOR_S, FLOOR_S)
    event = _env_float(contract.ENV_HANG_FLOOR_S, EVENT_FLOOR_S)
    return floor, event, _env_float(contract.ENV_HANG_FIRST_STEP_S, FIRST_STEP_S)


def hang_bound(intervals: list[float], heavy_intervals: list[float], *, next_is_heavy: bool,
               floor_s: float = FLOOR_S, event_floor_s: float = EVENT_FLOOR_S,
               first_step_s: float = FIRST_STEP_S) -> tuple[float, str]:
    """``(seconds, why)``: how long the run may go without a finished step. ``intervals``: the
    measured times between plain steps of this attempt; ``heavy_intervals``: those of steps that
    also evaluated or checkpointed; ``next_is_heavy``: the step due next does."""
    if len(intervals) < 2:
        return first_step_s, f"first steps of the attempt: {first_step_s:.0f} s (no step time measured yet)"
    step = statistics.median(intervals[-50:])
    if next_is_heavy and heavy_intervals:  # such a step was measured: it is the step time to beat
        heavy = max(heavy_intervals[-10:])
        bound = max(STEP_MULTIPLE * max(step, heavy), floor_s)
        return bound, (f"max({STEP_MULTIPLE:g} x measured evaluating/checkpointing step {heavy:.2f} s, "
                       f"floor {floor_s:.0f} s) = {bound:.0f} s")
    bound = max(STEP_MULTIPLE * step, floor_s)
    why = f"max({STEP_MULTIPLE:g} x measured step {step:.2f} s, floor {floor_s:.0f} s) = {bound:.0f} s"
    if next_is_heavy:  # none measured yet: a stated allowance
        bound += event_floor_s
        why += f" + {event_floor_s:.0f} s for the first evaluation/checkpoint of the attempt"
    return bound, why


# --- the ranks' side --------------------------------------------------------------------------

def flight_recorder_env(dump_dir: str) -> dict[str, str]:
    """GPU only: NCCL's flight recorder (torch 2.13 ``ProcessGroupNCCL.hpp``): a ring of the
    last collectives of every rank (``TORCH_NCCL_TRACE_BUFFER_SIZE`` entries), dumped when the
    NCCL watchdog times a collective out (``TORCH_NCCL_DUMP_ON_TIMEOUT``, which needs
    ``TORCH_NCCL_ENABLE_MONITORING``) to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``. A hang's probe
    copies whatever dump the node holds. Gloo (CPU) has no such recorder."""
    return {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_ENABLE_MONITORING": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": os.path.join(dump_dir, FLIGHT_RECORDER_PREFIX)}


class Progress:
    """One rank's reporter: :meth:`step` after every finished step (a no-op without a board).

    The board is a threaded actor (``max_concurrency``): Ray keeps no order between the calls
    of one caller to such an actor (Ray's docs, ``ray-core/actors/task-orders``, "Asynchronous or
    Threaded Actor": no guaranteed execution order; an argument not yet computed holds a call
    back while later ones run). The board
    drops a report from a rank it has not registered, so a report that must land waits for the
    rank's registration (``registered``) first: on a loaded machine the gate's report, made at
    once after the registration, ran before it and was dropped (the run recorded the gate's
    node as lost instead)."""

    def __init__(self, board: Any, rank: int, pid: int, registered: Any = None):
        self.board, self.rank, self.pid, self._registered = board, rank, pid, registered

    def _await_registration(self) -> None:
        if self._registered is not None:
            import ray

            try:
                ray.get(self._registered, timeout=30)
            except Exception as err:  # noqa: BLE001 - a late board must not fail the rank: report anyway
                log.warning("watchdog: rank %s's registration not confirmed (%s): reporting anyway",
                            self.rank, type(err).__name__)
            self._registered = None

    def started(self, step: int) -> None:
        """The rank restored ``step`` (0: a fresh start) and begins training."""
        if self.board is not None:
            self._await_registration()
            self.board.restored.remote(self.rank, self.pid, step, time.time())

    def step(self, step: int, *, heavy: bool = False) -> None:
        if self.board is not None:
            self.board.step.remote(self.rank, self.pid, step, heavy, time.time())

    def gate_failed(self, found: dict[str, Any]) -> None:
        """The health gate failed on this rank's node: waited for, so the board holds it before
        Ray Train sees this rank's error."""
        if self.board is not None:
            import ray

            self._await_registration()
            ray.get(self.board.gate.remote(self.rank, self.pid, found, time.time()), timeout=30)


def rank_progress(run_name: str, rank: int, start_step: int | None, local_dir: str) -> Progress:
    """Register this rank with the run's board (when the driver made one) and arm its stack dump.
    Called at worker start, before the model build, with ``start_step`` None (no step yet): a rank
    stuck in its build or restore is then visible to the watchdog; :meth:`Progress.started`
    follows the restore. ``faulthandler`` writes every thread's stack to a node-local file on :data:`STACK_SIGNAL`
    ``faulthandler`` writes every thread's stack to a node-local file on :data:`STACK_SIGNAL`
    (a C-level handler: it answers even while the training thread holds the GIL)."""
    import faulthandler

    pid = os.getpid()
    try:
        import ray

        board = ray.get_actor(board_name(run_name), namespace=NAMESPACE)
        node_id = ray.get_runtime_context().get_node_id()
        actor_id = ray.get_runtime_context().get_actor_id() or ""
    except Exception:  # noqa: BLE001 - a plain process, or a trainer started without the driver's watchdog
        return Progress(None, rank, pid)
    stacks = os.path.join(local_dir, "stacks")
    os.makedirs(stacks, exist_ok=True)
    stack_file = os.path.join(stacks, f"rank-{rank}-pid-{pid}.txt")
    handle = open(stack_file, "w", encoding="utf-8")  # noqa: SIM115 - faulthandler keeps the descriptor
    _kept.append(handle)
    faulthandler.register(STACK_SIGNAL, file=handle, all_threads=True, chain=False)
    registered = board.begin.remote(rank, {"pid": pid, "node_id": node_id, "actor_id": actor_id, "host": socket.gethostname(),
                              "node": os.environ.get(contract.ENV_NODE_NAME) or socket.gethostname(),
                              "stack_file": stack_file, "start_step": start_step,
                              "trace_prefix": os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "")}, time.time())
    return Progress(board, rank, pid, registered)


_kept: list[Any] = []
"""The open stack files: faulthandler writes to their descriptors for the process's life."""


# --- the board (an actor on the driver's node) --------------------------------------------------

class _Board:
    """What every rank of the current attempt reported. One attempt = one worker group: a rank
    that registers again with another pid starts the next attempt."""

    def __init__(self) -> None:
        self.attempt = 0
        self.ranks: dict[int, dict[str, Any]] = {}
        self.min_step_at: dict[int, float] = {}
        """This attempt: the time the slowest rank finished each step."""
        self.first_done: dict[int, float] = {}
        """Over all attempts: the first time every rank had finished each step."""
        self.heavy: set[int] = set()
        self.errors: dict[int, dict[int, dict[str, Any]]] = {}
        """attempt -> rank -> what Ray Train saw (:class:`FailureNotes`)."""
        self.started: dict[int, float] = {}
        self.gates: dict[int, dict[int, dict[str, Any]]] = {}
        """attempt -> rank -> what its health gate found (training/health_gate.py)."""

    def begin(self, rank: int, info: dict[str, Any], now: float) -> None:
        if rank in self.ranks and self.ranks[rank]["pid"] != info["pid"] or not self.ranks:
            self.attempt += 1
            self.ranks, self.min_step_at, self.heavy = {}, {}, set()
            self.started[self.attempt] = now
        self.ranks[rank] = {**info, "step": info["start_step"], "t": now, "attempt": self.attempt}

    def restored(self, rank: int, pid: int, step: int, now: float) -> None:
        mine = self.ranks.get(rank)
        if mine is not None and mine["pid"] == pid:
            mine.update(start_step=step, step=step, t=now)

    def _lowest(self) -> int | None:
        """The slowest rank's step, over the ranks that have one (a rank still building or
        restoring has none yet)."""
        known = [r["step"] for r in self.ranks.values() if r["step"] is not None]
        return min(known) if known else None

    def step(self, rank: int, pid: int, step: int, heavy: bool, now: float) -> None:
        mine = self.ranks.get(rank)
        if mine is None or mine["pid"] != pid:
            return  # a report of an attempt already replaced
        before = self._lowest()
        mine["step"], mine["t"] = step, now
        if heavy:
            self.heavy.add(step)
        after = self._lowest()
        if before is None:
            before = after - 1
        if after > before:
            for s in range(before + 1, after + 1):
                self.min_step_at[s] = now
                self.first_done.setdefault(s, now)

    def failed(self, errors: dict[int, dict[str, Any]]) -> None:
        self.errors.setdefault(self.attempt, {}).update(errors)

    def gate(self, rank: int, pid: int, found: dict[str, Any], now: float) -> None:
        mine = self.ranks.get(rank)
        if mine is not None and mine["pid"] == pid:
            self.gates.setdefault(self.attempt, {})[rank] = {**found, "t": now}

    def state(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "ranks": self.ranks, "min_step_at": self.min_step_at,
                "first_done": self.first_done, "heavy": sorted(self.heavy), "errors": self.errors,
                "started": self.started, "gates": self.gates}


def _board_actor(node_id: str, name: str) -> Any:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0, max_concurrency=64)(_Board)
    # Pinned to the driver's node: a lost worker node must not take the record of its loss with it.
    return remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                          name=name, namespace=NAMESPACE).remote()


def _probe(pid: int, stack_file: str, trace_prefix: str, kill: bool, wait_s: float) -> dict[str, Any]:
    """On the rank's node: its process state, its stack (faulthandler, by signal), NCCL's
    flight-recorder dumps; SIGKILL it when ``kill``."""
    import glob

    found: dict[str, Any] = {"state": "gone", "stack": "", "traces": {}}
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            found["state"] = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return found
    if kill:
        os.kill(pid, signal.SIGKILL)
        found["killed"] = True
        return found
    size = os.path.getsize(stack_file) if os.path.exists(stack_file) else 0
    try:
        os.kill(pid, STACK_SIGNAL)
    except OSError as err:
        found["stack_error"] = str(err)
    time.sleep(wait_s)
    try:
        with open(stack_file, encoding="utf-8", errors="replace") as handle:
            handle.seek(size)
            found["stack"] = handle.read()
    except OSError as err:
        found["stack_error"] = str(err)
    for path in glob.glob(trace_prefix + "*") if trace_prefix else []:
        with open(path, "rb") as handle:
            found["traces"][os.path.basename(path)] = handle.read()[-(8 << 20):]
    return found


class FailureNotes:
    """Ray Train ``UserCallback`` (runs in the controller): the worker errors Ray Train saw go to
    the run's board, with their ranks, before it restarts the group (ray 2.58
    ``train/v2/_internal/callbacks/user_callback.py``: ``after_exception`` follows every poll
    that found errors)."""

    def __new__(cls, run_name: str):  # a subclass of Ray's UserCallback, made when Ray is there
        from ray.train.v2.api.callback import UserCallback

        class _Notes(UserCallback):
            def __init__(self, name: str) -> None:
                self.run_name = name

            def __reduce__(self):
                return FailureNotes, (self.run_name,)

            def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
                try:
                    import ray

                    board = ray.get_actor(board_name(self.run_name), namespace=NAMESPACE)
                    board.failed.remote({rank: incidents.describe_error(err) for rank, err in worker_exceptions.items()})
                except Exception as err:  # noqa: BLE001 - a note must never fail the controller
                    log.warning("incident note not delivered: %s", err)

        return _Notes(run_name)


# --- the driver's side ---------------------------------------------------------------------------

class Watchdog:
    """The driver's watcher thread (see the module's docstring). ``start()`` before the fit,
    ``stop()`` after it, before the record's final write."""

    def __init__(self, *, run_name: str, run_dir: str, record: Any, max_steps: int, world_size: int, on_gpu: bool,
                 eval_every: int = 0, checkpoint_every: int = 0, checkpoint_minutes: float = 0.0,
                 stopping: Any = None) -> None:
        self.run_name, self.run_dir, self.record = run_name, run_dir.rstrip("/"), record
        self.max_steps, self.world_size, self.on_gpu = max_steps, world_size, on_gpu
        self.eval_every, self.checkpoint_every, self.checkpoint_minutes = eval_every, checkpoint_every, checkpoint_minutes
        self.stopping = stopping or (lambda: False)
        self.board = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.open: dict[str, Any] | None = None
        """The incident of the current attempt, once seen: ``{"entry", "attempt", "seen"}``."""
        self.waiting: list[dict[str, Any]] = []
        """Incidents whose next attempt has not finished its first step yet."""
        self.attempt = 0
        self.ray_seen: list[dict[str, Any]] = []
        """The incidents Ray Train's errors opened: looked at again at the end (:meth:`stop`)."""
        self.lock = threading.Lock()

    def start(self) -> "Watchdog":
        import ray

        try:  # a board left by an earlier driver of this run: its ranks are gone
            ray.kill(ray.get_actor(board_name(self.run_name), namespace=NAMESPACE))
        except ValueError:
            pass
        self.board = _board_actor(ray.get_runtime_context().get_node_id(), board_name(self.run_name))
        ray.get(self.board.state.remote())  # up before any rank looks for it
        self._thread = threading.Thread(target=self._loop, name="progress-watchdog", daemon=True)
        self._thread.start()
        return self

    def callback(self) -> Any:
        return FailureNotes(self.run_name)

    def stop(self, failed: bool = False) -> None:
        """End the watch; a last look records what the final attempt's errors were."""
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        try:
            self.check(self._state(), final=True)
        except Exception as err:  # noqa: BLE001 - the record of the run matters more than the last look
            log.warning("watchdog: last look failed: %s", err)
        try:
            with self.lock:  # a node lost shortly before the end may be marked dead only now
                for pending in self.ray_seen:
                    self._look_again(pending)
        except Exception as err:  # noqa: BLE001
            log.warning("watchdog: last look at Ray's record failed: %s", err)
        import ray

        if self.board is not None:
            ray.kill(self.board)

    def _state(self) -> dict[str, Any]:
        import ray

        return ray.get(self.board.state.remote(), timeout=30)

    def _loop(self) -> None:
        while not self._done.wait(POLL_S):
            try:
                self.check(self._state())
            except Exception as err:  # noqa: BLE001 - a failed look is retried at the next poll
                log.warning("watchdog: %s: %s", type(err).__name__, err)

    # -- one look -----------------------------------------------------------------------------

    def check(self, state: dict[str, Any], *, final: bool = False, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self.lock:
            attempt = state["attempt"]
            if attempt > self.attempt:
                self._new_attempt(state, attempt, now)
            self._resolve_waiting(state)
            gates = (state.get("gates") or {}).get(attempt) or {}
            if gates:
                self._gate_failed(state, gates, now)
            errors = (state.get("errors") or {}).get(attempt) or {}
            if errors:
                self._ray_saw(state, errors, now)
            elif not final and self.open is None:
                self._hang_check(state, now)

    def _new_attempt(self, state: dict[str, Any], attempt: int, now: float) -> None:
        previous, self.attempt = self.attempt, attempt
        if previous == 0:
            return
        if self.open is None:  # a restart the watchdog did not see coming nor Ray's note explain
            self._add(incidents.incident(incidents.WORKER_ERROR, detail="the worker group restarted without a "
                                         "reported error (see the run's logs)", step=None), previous, now)
        if self.open.get("errors") is not None:  # by now Ray knows which worker died and why
            self._reclassify(self.open)
        start = [r["start_step"] for r in state["ranks"].values() if r["start_step"] is not None]
        self.open["resumed_from_step"] = min(start) if start else None
        self.waiting.append(self.open)
        self.open = None

    def _reclassify(self, pending: dict[str, Any]) -> None:
        """Name the incident again from Ray's record as it stands now. A node lost whole is often
        seen by Ray Train first (its poll of the node's worker fails within seconds) and marked
        dead by the GCS only after its health checks fail (5 x 3 s by default), after Ray Train
        already ``ray.kill``ed that worker (so its actor died of ``RAY_KILL``, not ``NODE_DIED``):
        the node's death, once the GCS records it, is the evidence. Looked at again when the next
        attempt starts and when it trains again."""
        entry, ranks = pending["entry"], pending["ranks"]
        kind, named = self._kinds(ranks, pending["errors"])
        if (kind, named) != (entry["kind"], entry["ranks"]) and incidents.KINDS.index(kind) < incidents.KINDS.index(entry["kind"]):
            entry["detail"] += (f"; first seen as {entry['kind']} of rank {entry['ranks']}, Ray's record of the deaths "
                                f"says {kind}{incidents.ray_nodes(kind, ranks, named)}")
            entry.update(kind=kind, ranks=named, nodes=sorted({ranks[r]["node"] for r in named if r in ranks}))
            self.record.update(**{contract.INCIDENTS: list(self.record.data.get(contract.INCIDENTS) or [])})

    def _look_again(self, pending: dict[str, Any]) -> None:
        """:meth:`_reclassify` again, later, for the kinds a lost node is first taken for: the
        GCS may mark the node dead only after the next attempt started (Ray Train restarts the
        group as soon as its poll fails; the GCS waits for 5 failed health checks)."""
        if pending.get("errors") is not None and pending["entry"]["kind"] in (incidents.WORKER_LOST,
                                                                              incidents.WORKER_ERROR):
            self._reclassify(pending)

    def _resolve_waiting(self, state: dict[str, Any]) -> None:
        # The ranks register at worker start, before their restore: the step the next attempt
        # resumed from is known only once they restored.
        restored = [r["start_step"] for r in state["ranks"].values() if r["start_step"] is not None]
        for pending in self.waiting:
            if pending["resumed_from_step"] is None and state["attempt"] > pending["attempt"] and restored:
                pending["resumed_from_step"] = min(restored)
        after = {int(k): v for k, v in (state.get("min_step_at") or {}).items()}
        ready = [p for p in self.waiting if p["resumed_from_step"] is not None] if after else []
        if not ready:
            return
        for pending in ready:  # the next attempt can start before the GCS marked a lost node dead
            self._look_again(pending)
        again = after[min(after)]
        done = {int(k): v for k, v in (state.get("first_done") or {}).items()}
        # One step's time, measured before the faults (an attempt that failed before its first
        # step measured none).
        step_s = next((p["step_s"] for p in reversed(ready) if p.get("step_s")), 0.0)
        previous_end = None
        for i, pending in enumerate(ready):
            resumed = pending["resumed_from_step"]
            started = (state.get("started") or {}).get(pending["attempt"]) or pending["seen"]
            since = done.get(resumed, started) if resumed else started
            # Several restarts before the run trained again (an attempt failed before its first
            # step) lost ONE stretch of time: each incident owns it up to the next one's sighting,
            # the last up to training again, so their losses add up to the run's.
            if previous_end is not None:
                since = max(since, previous_end)
            end = ready[i + 1]["seen"] if i + 1 < len(ready) else again - step_s
            incidents.resolved(self.record, pending["entry"], resumed_from_step=resumed,
                               progress_again_s=again - pending["seen"], wall_lost_s=end - since,
                               devices=self.world_size, on_gpu=self.on_gpu)
            previous_end = end
            self.waiting.remove(pending)
            log.warning("watchdog: training again %.0f s after the %s", again - pending["seen"], pending["entry"]["kind"])

    def _add(self, entry: dict[str, Any], attempt: int, now: float, step_s: float = 0.0) -> None:
        incidents.add(self.record, entry)
        self.open = {"entry": entry, "attempt": attempt, "seen": now, "resumed_from_step": None, "step_s": step_s}

    def _nodes_alive(self) -> dict[str, bool]:
        try:
            import ray

            return {n["NodeID"]: bool(n.get("Alive")) for n in ray.nodes()}
        except Exception:  # noqa: BLE001
            return {}

    def _kinds(self, ranks: dict[int, dict[str, Any]], errors: dict[int, dict[str, Any]]) -> tuple[str, list[int]]:
        """The incident's kind and the ranks it names, from Ray's record as it stands now: which
        nodes are alive and why each worker actor died (:func:`training.incidents.name_fault`)."""
        alive = self._nodes_alive()
        return incidents.name_fault(ranks, errors, alive=alive, deaths=incidents.death_reasons(ranks))

    def _ray_saw(self, state: dict[str, Any], errors: dict[int, dict[str, Any]], now: float) -> None:
        ranks = state["ranks"]
        kind, named = self._kinds(ranks, errors)
        detail = "; ".join(f"rank {r}: {'/'.join(errors[r]['classes'])}: {errors[r]['text'][:160]}" if r in errors
                           else f"rank {r}: its worker died ({kind})" for r in named) + incidents.ray_nodes(kind, ranks, named)
        if self.open is not None and self.open["attempt"] == self.attempt:
            entry = self.open["entry"]
            if self.open.get("ray_noted"):
                return
            self.open["ray_noted"] = True
            if entry["kind"] == incidents.HEALTH_GATE and all(errors[r]["classes"][:1] == [GateFailed.__name__]
                                                              for r in named if r in errors):
                detail = "the gate's error, and restarted the group"  # the gate's own words are already there
            entry["detail"] += f"; then Ray Train saw: {detail}"
            if entry["kind"] == incidents.HANG and kind == incidents.NODE_LOST:
                entry["kind"] = kind  # the node went: the hang was its symptom
            self.record.update(**{contract.INCIDENTS: list(self.record.data.get(contract.INCIDENTS) or [])})
            return
        step = max((r["step"] for r in ranks.values() if r["step"] is not None), default=None)
        entry = incidents.incident(kind, ranks=named, nodes=[ranks[r]["node"] for r in named if r in ranks],
                                   step=step, detail=detail,
                                   saved=incidents.saved_when_ray_saw(kind))
        self._add(entry, self.attempt, now, self._step_s(state))
        self.open.update(ray_noted=True, ranks=ranks, errors=errors)
        self.ray_seen.append(self.open)

    def _gate_failed(self, state: dict[str, Any], gates: dict[int, dict[str, Any]], now: float) -> None:
        """One ``health_gate`` incident per attempt, naming every rank whose gate failed and its
        node. Ray Train's error for the same rank (seen first or after) only adds to its detail."""
        ranks = {int(k): v for k, v in state["ranks"].items()}
        named = sorted(int(r) for r in gates)
        nodes = sorted({g["node"] for g in gates.values()})
        detail = "; ".join(f"rank {r} on {gates[r]['node']}: {', '.join(gates[r]['failed'])} "
                           f"(gate {gates[r]['seconds']} s); {gates[r]['kept_out']}" for r in named)
        # Before the attempt's first step: the furthest step the run had finished is its last attempt's.
        furthest = max((int(k) for k in (state.get("first_done") or {})), default=None)
        open_ = self.open if self.open is not None and self.open["attempt"] == self.attempt else None
        if open_ is not None and open_["entry"]["kind"] == incidents.HEALTH_GATE:
            if open_["entry"]["ranks"] == named:
                return
            open_["entry"].update(ranks=named, nodes=nodes, detail=detail)
        elif open_ is not None:  # Ray Train's error for the failing rank reached the board first
            entry = open_["entry"]
            entry.update(kind=incidents.HEALTH_GATE, ranks=named, nodes=nodes,
                         step=entry["step"] if entry["step"] is not None else furthest,
                         detail=f"{detail}; then Ray Train saw: {entry['detail']}")
            open_.pop("errors", None)  # the gate's finding, not the errors, says which fault it was
        else:
            self._add(incidents.incident(incidents.HEALTH_GATE, ranks=named, nodes=nodes, detail=detail,
                                         step=furthest), self.attempt, now, self._step_s(state))
            return
        self.record.update(**{contract.INCIDENTS: list(self.record.data.get(contract.INCIDENTS) or [])})

    def _step_s(self, state: dict[str, Any]) -> float:
        times = sorted((int(k), v) for k, v in (state.get("min_step_at") or {}).items())
        gaps = [b[1] - a[1] for a, b in zip(times, times[1:])]
        return statistics.median(gaps) if gaps else 0.0

    def _hang_check(self, state: dict[str, Any], now: float) -> None:
        ranks = {int(k): v for k, v in state["ranks"].items()}
        if self.stopping() or not state["attempt"]:
            return
        missing = [r for r in range(self.world_size) if r not in ranks]
        waiting = [r for r, info in ranks.items() if info["step"] is None]
        if missing or waiting:  # the attempt is still building, opening its data, restoring
            first = floors()[2]
            started = (state.get("started") or {}).get(state["attempt"])
            if started is None or now - started <= first:
                return
            self._declare_hang(ranks, None, now - started, f"first-step bound {first:.0f} s since the attempt "
                               "started: model build, data, restore", 0.0, now, missing=missing)
            return
        lowest = min(r["step"] for r in ranks.values())
        if lowest >= self.max_steps:
            return  # evaluation and export after the last step: Ray's health check covers them
        times = sorted((int(k), v) for k, v in (state.get("min_step_at") or {}).items())
        heavy = set(state.get("heavy") or [])
        plain, slow = [], []
        for (a, ta), (b, tb) in zip(times, times[1:]):
            (slow if b in heavy else plain).append(tb - ta)
        floor, event_floor, first = floors()
        bound, why = hang_bound(plain, slow, next_is_heavy=self._heavy_next(lowest + 1, times),
                                floor_s=floor, event_floor_s=event_floor, first_step_s=first)
        last = times[-1][1] if times else max(r["t"] for r in ranks.values())
        if now - last <= bound:
            return
        self._declare_hang(ranks, lowest, now - last, why, self._step_s(state), now)

    def _heavy_next(self, step: int, times: list[tuple[int, float]]) -> bool:
        if self.eval_every and step % self.eval_every == 0:
            return True
        if self.checkpoint_every and step % self.checkpoint_every == 0:
            return True
        return bool(self.checkpoint_minutes)  # a checkpoint by time may fall on any step

    def _declare_hang(self, ranks: dict[int, dict[str, Any]], lowest: int | None, idle_s: float, why: str,
                      step_s: float, now: float, *, missing: list[int] = ()) -> None:
        """``lowest`` None: some rank has no step yet (``missing``: ranks that never registered);
        those are named. Otherwise the ranks at ``lowest`` that are stopped or do not answer (else
        all ranks at it). Only ranks whose pid the board holds are probed and killed."""
        log.warning("watchdog: no step for %.0f s (bound %s): saving stacks, restarting the workers", idle_s, why)
        number = len(self.record.data.get(contract.INCIDENTS) or []) + 1
        folder = f"{self.run_dir}/{INCIDENTS_DIR}/{number}-{incidents.HANG}"
        found = self._on_nodes({r: info for r, info in ranks.items() if info.get("pid")}, kill=False)
        saved = []
        for rank, result in sorted(found.items()):
            text = result.get("stack") or f"(no stack: process state {result.get('state')} {result.get('error', '')})\n"
            saved.append(_write(f"{folder}/rank-{rank}.txt", text.encode()))
            for name, data in (result.get("traces") or {}).items():
                saved.append(_write(f"{folder}/{name}", data))
        if lowest is None:
            named = sorted({*missing, *(r for r, info in ranks.items() if info["step"] is None)})
        else:
            behind = [r for r, info in ranks.items() if info["step"] == lowest]
            stuck = [r for r in behind if found.get(r, {}).get("state") in ("T", "t", "D", "Z", "gone", NO_ANSWER)]
            named = sorted(stuck or behind)

        def state_of(r: int) -> str:
            if r not in ranks:
                return f"rank {r}: never registered"
            step = ranks[r]["step"]
            return f"rank {r}: {'no step yet' if step is None else f'step {step}'}, process {found.get(r, {}).get('state')}"

        detail = f"no step for {idle_s:.0f} s (bound {why}); " + ", ".join(
            state_of(r) for r in sorted({*ranks, *missing}))
        # A rank whose node did not answer the probe is not sent a kill that would wait as long
        # again; Ray's own health check remains the backstop for it. A rank that never registered
        # has no pid: the registered ranks (waiting on it) are killed so the group restarts.
        targets = [r for r in named if r in ranks] or sorted(ranks)
        unanswered = [r for r in targets if found.get(r, {}).get("state") == NO_ANSWER]
        kill = [r for r in targets if found.get(r, {}).get("state") not in (NO_ANSWER, "gone")]
        if unanswered:
            detail += f"; not killed (no answer to the probe): rank {', '.join(map(str, unanswered))}"
        known = [info["step"] for info in ranks.values() if info["step"] is not None]
        entry = incidents.incident(incidents.HANG, ranks=named, nodes=sorted({ranks[r]["node"] for r in named if r in ranks}),
                                   step=max(known, default=None), saved=saved, detail=detail)
        self._add(entry, self.attempt, now, step_s)
        # Ray Train sees the dead worker at its next poll and restarts the group
        for rank, result in self._on_nodes({r: ranks[r] for r in kill}, kill=True).items():
            if result.get("state") == NO_ANSWER:
                log.warning("watchdog: could not stop rank %d: %s", rank, result.get("error"))

    def _on_nodes(self, infos: dict[int, dict[str, Any]], *, kill: bool) -> dict[int, dict[str, Any]]:
        """Run the probe on every rank's node at once and wait ONE :data:`PROBE_TIMEOUT_S` for all
        of them (one at a time, the timeouts would add up while the watchdog holds its lock); a
        rank whose task did not finish in it is :data:`NO_ANSWER`."""
        import ray

        refs = {rank: self._on_node(info, kill=kill) for rank, info in infos.items()}
        if not refs:
            return {}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
        out: dict[int, dict[str, Any]] = {}
        for rank, ref in refs.items():
            if ref not in ready:
                out[rank] = {"state": NO_ANSWER, "error": f"no answer within {PROBE_TIMEOUT_S:.0f} s"}
                continue
            try:
                out[rank] = ray.get(ref)
            except Exception as err:  # noqa: BLE001 - a node whose task failed is itself the finding
                out[rank] = {"state": NO_ANSWER, "error": f"{type(err).__name__}: {str(err)[:200]}"}
        return out

    def _on_node(self, info: dict[str, Any], *, kill: bool) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(num_cpus=0, max_retries=0)(_probe).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(info["node_id"], soft=False))
        return task.remote(info["pid"], info["stack_file"], info.get("trace_prefix", ""), kill, DUMP_WAIT_S)


def _write(uri: str, data: bytes) -> str:
    """Write ``data`` to a local path or an ``s3://`` URI (the storage room's one way); returns the URI."""
    from training.storage.files import write_bytes

    write_bytes(uri, data)
    return uri
