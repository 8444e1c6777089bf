"""The session's services that stop once no later test of the process needs them.

An idle Ray head burns ~3.2 CPU-s a minute and the tests' ``ray.init`` cluster ~1.8
(docs/testing.md "What a Ray head burns"); the tests that use them go out first
(tests/conftest.py ``pytest_collection_modifyitems``), so kept to the session's end they idled
through most of it on the same two cores as every other test. The fixtures that hold them
(tests/conftest.py ``ray_cluster``, ``warm_head``, ``local_run_mlflow``) run their bodies in
:func:`released_when_unneeded`; the conftest's ``pytest_runtest_teardown`` calls
:func:`release_unneeded` after each test's own fixtures are torn down.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

RELEASABLE = frozenset({"ray_cluster", "warm_head", "local_run_mlflow"})
"""The session fixtures that may stop early (by name)."""

RUNNING: dict[str, contextlib.ExitStack] = {}
"""Each releasable fixture set up in this process and not yet stopped: what stops it."""

RELEASED: set[str] = set()
"""The fixtures stopped early in this process: pytest keeps their values cached, so a test that
takes one afterwards would get a stopped service (:func:`refuse_released`)."""

IN_ORDER_MODES = ("no", "loadgroup")
"""The ``--dist`` modes under which a process runs its units in the order of their first items:
one process, and ``make test``'s ``loadgroup`` (tests/conftest.py ``pytest_xdist_make_scheduler``
hands units out first in, first out; xdist 3.8 ``scheduler/loadscope.py``
``_assign_work_unit``). ``loadscope`` and ``loadfile`` sort units by size and ``worksteal``
takes from a queue's tail: under them nothing is released early."""

_NEEDED_FROM = pytest.StashKey[dict]()


def runs_in_order(config: pytest.Config) -> bool:
    """Whether this process runs its units in the order of their first items
    (:data:`IN_ORDER_MODES`). An xdist worker does not see the mode: xdist 3.8 ``remote.py``
    ``setup_config`` sets a worker's ``option.dist`` to ``"no"`` whatever it was and keeps only
    ``option.loadgroup`` (``dist == "loadgroup"``). Without xdist (``-p no:xdist``) no ``--dist``
    is registered: one process, in order."""
    if hasattr(config, "workerinput"):  # an xdist worker
        return bool(getattr(config.option, "loadgroup", False))
    return config.getoption("dist", default="no") in IN_ORDER_MODES


@contextlib.contextmanager
def released_when_unneeded(name: str) -> Iterator[contextlib.ExitStack]:
    """The body of session fixture ``name``: what it enters on the yielded stack is closed when
    no later test of this process takes ``name`` (:func:`release_unneeded`), or at the session's
    end, whichever comes first."""
    stack = contextlib.ExitStack()
    RUNNING[name] = stack
    try:
        yield stack
    finally:
        RUNNING.pop(name, None)
        stack.close()  # a no-op once released early


def release_unneeded(session: pytest.Session, nextitem: pytest.Item) -> None:
    """Stop every running service that no test this process may still run takes, under an
    :data:`IN_ORDER_MODES` mode. A service's own end checks (the warm head's) raise here: pytest
    reports them as an error in the teardown of the test that ran last."""
    if RUNNING and runs_in_order(session.config):
        needed = needed_from(session, nextitem)
        for name in [name for name in RUNNING if name not in needed]:
            RELEASED.add(name)
            RUNNING.pop(name).close()


def refuse_released(item: pytest.Item) -> None:
    """Fail ``item`` in one line if it takes a service this process already stopped. The order
    :func:`needed_from` relies on can still break: when an xdist worker crashes, xdist hands its
    unfinished units to the others at the END of their queues (3.8 ``scheduler/loadscope.py``
    ``remove_node``: ``self.workqueue.update(workload)``)."""
    taken = RELEASED.intersection(getattr(item, "fixturenames", ()))
    if taken:
        pytest.fail(f"{item.nodeid}: takes {', '.join(sorted(taken))}, which this process stopped when no later "
                    "test seemed to need it (a unit out of order: a crashed worker's re-queued tests?); "
                    "rerun it alone", pytrace=False)


def needed_from(session: pytest.Session, item: pytest.Item) -> frozenset[str]:
    """The :data:`RELEASABLE` fixtures that any test this process may still run, from ``item`` on,
    takes: those of every item from the first item of ``item``'s unit of work on, in the session's
    order. A unit (tests/conftest.py ``pytest_xdist_make_scheduler``) is a module or an
    ``xdist_group``, whose modules may lie apart (a group's later module can come after units a
    worker runs after it). Units go out in the order of their first items, so any unit a process
    gets later starts after the first item of this one, and so do all of its items; in one process
    (``-n 0``) the items run in the session's order. ``fixturenames`` is each item's closure
    (``local_run`` brings ``local_run_mlflow``). Computed once, as suffix sets."""
    stash = session.stash.setdefault(_NEEDED_FROM, {})
    if not stash:
        items = session.items
        first: dict[str, int] = {}
        for index, each in enumerate(items):
            first.setdefault(unit_of(each), index)
        suffix: list[frozenset[str]] = [frozenset()] * (len(items) + 1)
        for index in range(len(items) - 1, -1, -1):
            suffix[index] = suffix[index + 1] | (frozenset(getattr(items[index], "fixturenames", ())) & RELEASABLE)
        stash.update({each.nodeid: suffix[first[unit_of(each)]] for each in items})
    return stash.get(item.nodeid, RELEASABLE)


def unit_of(item: pytest.Item) -> str:
    """The unit of work ``item`` goes out in: its ``xdist_group``, else its module."""
    group = item.get_closest_marker("xdist_group")
    if group is not None:
        return "group:" + str(group.kwargs.get("name", group.args[0] if group.args else ""))
    return item.nodeid.split("::", 1)[0]
