"""The suite's tiers (tests/tiers.py): each test is marked by what it runs, and a ``unit`` test
that starts a process anyway fails, naming the marker it needs. Shown on throw-away test files
collected and run in this process by pytest's own ``pytester``, with this suite's hooks."""
from __future__ import annotations

import types

import pytest

import tiers

pytest_plugins = ["pytester"]

INNER_CONFTEST = """
import pytest

@pytest.fixture(scope="session")
def ray_cluster():
    return "stands for the session's Ray cluster"
"""

INNER_TESTS = '''
import subprocess
import pytest

def spawn():
    return subprocess.run(["true"])

def test_plain():
    assert 1 + 1 == 2

def test_direct():
    subprocess.run(["true"])

def test_through_a_helper():
    spawn()

def test_cdk8s():
    import cdk8s
    cdk8s.App()

def test_takes_ray(ray_cluster):
    pass

@pytest.mark.slow
def test_marked_slow():
    pass

@pytest.mark.synth
def test_marked_synth():
    pass

def test_hidden():
    getattr(__import__("sub" + "process"), "run")(["true"])
'''


@pytest.fixture
def inner(pytester, monkeypatch, request):
    """A throw-away suite with this suite's hooks (tests/conftest.py), whose helpers count as
    tests/ code (followed like this suite's)."""
    conftest = request.config.pluginmanager.get_plugin(str(tiers.TESTS / "conftest.py"))
    hooks = types.ModuleType("tier_hooks")
    for name in ("pytest_collection_modifyitems", "pytest_runtest_setup", "pytest_runtest_call"):
        setattr(hooks, name, getattr(conftest, name))
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_inner=INNER_TESTS)
    monkeypatch.setattr(tiers, "TESTS", pytester.path)
    return pytester, hooks


def test_each_test_is_marked_with_the_costliest_thing_it_runs(inner):
    pytester, hooks = inner
    items = pytester.inline_run("--collect-only", plugins=[hooks]).getcalls("pytest_collection_finish")[0].session.items
    tier = {item.name: [m.name for m in item.iter_markers() if m.name in tiers.TIERS] for item in items}
    assert tier == {
        "test_plain": ["unit"],
        "test_direct": ["subprocess"],
        "test_through_a_helper": ["subprocess"],
        "test_cdk8s": ["synth"],
        "test_takes_ray": ["ray"],
        "test_marked_slow": ["ray"],
        "test_marked_synth": ["synth"],
        "test_hidden": ["unit"],  # what reading the code misses: the guard's case below
    }
    assert all(item.get_closest_marker("slow") for item in items if item.name in ("test_takes_ray",))


def test_a_unit_test_that_starts_a_process_fails_and_names_its_marker(inner, monkeypatch):
    started = []
    monkeypatch.setattr("subprocess.Popen._execute_child", lambda *a, **k: started.append(a))
    pytester, hooks = inner
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-k", "hidden or plain", plugins=[hooks])
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_hidden is in the unit tier but started a process: "
                                 "mark it pytest.mark.subprocess*"])
    assert started == []  # refused before anything started


def test_minus_m_selects_a_tier(inner):
    pytester, hooks = inner
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-m", "ray", "--collect-only", "-q",
                                          plugins=[hooks])
    result.stdout.fnmatch_lines(["*test_takes_ray", "*test_marked_slow", "2/8 tests collected*"])
