"""The session's services stop once no later test of the process takes them
(tests/session_services.py), and never while one still may: a unit of work that is an
``xdist_group`` spans modules that lie apart in the session's order, and a unit a worker gets
after it can start between them."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from session_services import RUNNING, needed_from, release_unneeded, released_when_unneeded


@dataclass
class Item:
    """What the hook reads of a collected test: its id, its fixture closure, its group marker."""
    nodeid: str
    fixturenames: tuple[str, ...] = ()
    group: str | None = None
    marks: dict = field(default_factory=dict)

    def get_closest_marker(self, name):
        if name == "xdist_group" and self.group:
            return pytest.mark.xdist_group(self.group).mark
        return None


def session(*items: Item):
    return SimpleNamespace(items=list(items), stash=pytest.Stash())


# The session's order: a training module on the Ray cluster, the shared run's group (its first
# module, then a Ray module another unit brings, then the group's second module), then unit tests.
TRAIN = Item("tests/training/test_loop.py::test_fit", ("ray_cluster",))
GROUP_FIRST = Item("tests/e2e/test_local_run_commands.py::test_own_data", ("local_run", "local_run_mlflow"), "local_run")
BETWEEN = Item("tests/training/test_health_gate_ray.py::test_gate", ("ray_cluster",))
GROUP_LATER = Item("tests/training/test_tracking_real_run.py::test_mlflow", ("local_run", "local_run_mlflow"), "local_run")
UNIT = Item("tests/training/test_config.py::test_fields")
UNIT_2 = Item("tests/training/test_config.py::test_more")


def test_a_service_no_later_test_takes_is_not_needed_and_one_a_later_test_takes_is():
    # Given the session above, when the next test is a unit test after every Ray test,
    order = session(TRAIN, GROUP_FIRST, BETWEEN, GROUP_LATER, UNIT, UNIT_2)
    # then nothing is needed any more; before the last Ray module, the Ray cluster is.
    assert needed_from(order, UNIT_2) == frozenset()
    assert needed_from(order, BETWEEN) == {"ray_cluster", "local_run_mlflow"}


def test_a_group_s_later_module_keeps_what_a_unit_sent_after_the_group_needs():
    # Given a worker that runs the whole local_run group (GROUP_FIRST, then GROUP_LATER) and only
    # then BETWEEN, a unit that went out after the group but lies between its modules,
    order = session(TRAIN, GROUP_FIRST, BETWEEN, GROUP_LATER, UNIT)
    # when the next test is the group's later module, then the Ray cluster BETWEEN takes is still
    # needed (counted from the group's first item, not from GROUP_LATER's place).
    assert "ray_cluster" in needed_from(order, GROUP_LATER)


def test_released_services_stop_once_and_the_session_end_stops_the_rest():
    stopped: list[str] = []
    order = session(TRAIN, UNIT, UNIT_2)
    with released_when_unneeded("ray_cluster") as stack:
        stack.callback(stopped.append, "ray_cluster")
        release_unneeded(order, TRAIN)  # the next test takes it: kept
        assert stopped == [] and "ray_cluster" in RUNNING
        release_unneeded(order, UNIT)  # no later test takes it: stopped
        assert stopped == ["ray_cluster"] and "ray_cluster" not in RUNNING
    assert stopped == ["ray_cluster"]  # the fixture's own end stops nothing twice
    with released_when_unneeded("warm_head") as stack:
        stack.callback(stopped.append, "warm_head")
    assert stopped == ["ray_cluster", "warm_head"] and not RUNNING  # never released early: stopped at the end
