"""The session's services stop once no later test of the process takes them
(tests/session_services.py), and never while one still may: a unit of work that is an
``xdist_group`` spans modules that lie apart in the session's order, and a unit a worker gets
after it can start between them."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

import session_services
from session_services import needed_from, refuse_released, release_unneeded, released_when_unneeded


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


@pytest.fixture(autouse=True)
def own_registry(monkeypatch):
    """Registries of this module's own: the session's (its real Ray cluster or warm head, running
    in this process) must not be released or marked by these stand-ins."""
    monkeypatch.setattr(session_services, "RUNNING", {})
    monkeypatch.setattr(session_services, "RELEASED", set())


def session(*items: Item, dist: str = "loadgroup"):
    """An xdist worker's session under ``--dist`` mode ``dist`` (``make test``'s by default). What
    the worker's config holds, as xdist 3.8 ``remote.py`` ``setup_config`` leaves it: a
    ``workerinput``, ``option.dist`` set to ``"no"`` whatever the mode, and ``option.loadgroup``
    true only under ``loadgroup``."""
    option = SimpleNamespace(dist="no", loadgroup=dist == "loadgroup")
    config = SimpleNamespace(workerinput={"workerid": "gw0"}, option=option,
                             getoption=lambda name, default=None: getattr(option, name, default))
    return SimpleNamespace(items=list(items), stash=pytest.Stash(), config=config)


def one_process(*items: Item, dist: str | None = None):
    """A session with no xdist worker: ``-n 0`` or no ``-n`` (``--dist`` given or ``"no"``), or
    ``None``: pytest run without xdist (``-p no:xdist``), which registers no ``--dist`` option."""
    options = {} if dist is None else {"dist": dist}

    def getoption(name, default=NO_DEFAULT):
        # pytest 9.0 Config.getoption: an option no plugin registered is its default, or a ValueError
        if name in options:
            return options[name]
        if default is NO_DEFAULT:
            raise ValueError(f"no option named {name!r}")
        return default

    return SimpleNamespace(items=list(items), stash=pytest.Stash(), config=SimpleNamespace(getoption=getoption))


NO_DEFAULT = object()


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
        assert stopped == [] and "ray_cluster" in session_services.RUNNING
        release_unneeded(order, UNIT)  # no later test takes it: stopped
        assert stopped == ["ray_cluster"] and "ray_cluster" not in session_services.RUNNING
    assert stopped == ["ray_cluster"]  # the fixture's own end stops nothing twice
    with released_when_unneeded("warm_head") as stack:
        stack.callback(stopped.append, "warm_head")
    assert stopped == ["ray_cluster", "warm_head"] and not session_services.RUNNING  # never released early: stopped at the end


def test_a_mode_that_sends_units_out_of_order_releases_nothing_and_a_released_service_taken_later_fails_the_test():
    stopped: list[str] = []
    # Given a worker under --dist loadscope (xdist sorts its units by size; the worker's own
    # option.dist reads "no" all the same), nothing stops early;
    with released_when_unneeded("ray_cluster") as stack:
        stack.callback(stopped.append, "ray_cluster")
        release_unneeded(session(TRAIN, UNIT, dist="loadscope"), UNIT)
        assert stopped == [] and "ray_cluster" in session_services.RUNNING
        # under loadgroup it stops, and a test that takes it afterwards (a crashed worker's
        # re-queued unit) fails in one line naming it instead of meeting a stopped service.
        release_unneeded(session(TRAIN, UNIT), UNIT)
        assert stopped == ["ray_cluster"]
    refuse_released(UNIT)  # takes nothing stopped: passes
    with pytest.raises(pytest.fail.Exception, match=r"test_loop.py::test_fit: takes ray_cluster, which this process stopped"):
        refuse_released(TRAIN)


def test_without_xdist_the_one_process_releases_in_order():
    # Given pytest -p no:xdist (no --dist option at all: one process, the session's own order),
    stopped: list[str] = []
    with released_when_unneeded("ray_cluster") as stack:
        stack.callback(stopped.append, "ray_cluster")
        # when no later test takes the cluster, then it stops, as under --dist no.
        release_unneeded(one_process(TRAIN, UNIT), UNIT)
        assert stopped == ["ray_cluster"]
    with released_when_unneeded("ray_cluster") as stack:  # and as under -n 0 (xdist's --dist no)
        stack.callback(stopped.append, "ray_cluster again")
        release_unneeded(one_process(TRAIN, UNIT, dist="no"), UNIT)
        assert stopped == ["ray_cluster", "ray_cluster again"]
