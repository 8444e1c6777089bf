"""The suite's tiers by cost, and the guard that keeps the cheapest one honest (docs/testing.md).

A test's tier is the costliest thing it does:

- ``unit``: no synth, no subprocess, no Ray (``make test-unit``);
- ``subprocess``: starts a process (the CLI as a user runs it, a registry, a tracking server,
  ranks spawned by ``torch.multiprocessing``, a bare runtime);
- ``synth``: runs the CDK or the cdk8s app (jsii: a Node.js process and its round trips);
- ``ray``: starts Ray or trains (the old ``slow`` marker, which stays its alias);
- ``cluster``: runs against the real Kubernetes control plane (tests/cluster/plane.py; its
  session fixture ``plane`` starts it once, after scripts/build-control-plane.sh built it).

Nobody marks ``unit``: :func:`tier_of` reads it off the test at collection, from an explicit
marker (``slow``/``ray``, ``synth``, ``subprocess``: for what it cannot see), the Ray-starting
session fixtures, and the code the test and its fixtures run: their own functions and the
helpers under ``tests/`` they call, transitively, and one level into the product's functions
they call (with the helpers of those functions' own module). What that reading misses, :func:`unit_guard` catches: a ``unit`` test that starts a
process or a jsii object fails, naming what to mark.
"""
from __future__ import annotations

import ast
import contextlib
import dis
import importlib.util
import inspect
import multiprocessing.process
import os
import subprocess
import sys
import threading
import types
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import pytest

TIERS = ("unit", "subprocess", "synth", "ray", "cluster")
"""Cheapest first; each is a pytest marker (pyproject.toml) and a make target (``make test-<tier>``)."""

RAY_FIXTURES = ("ray_cluster", "local_run", "warm_head")
"""Session fixtures that start Ray (tests/conftest.py)."""

CLUSTER_FIXTURES = ("plane",)
"""The session fixture that starts the control plane (tests/cluster/conftest.py)."""

ALIASES = {"slow": "ray"}
"""Markers of the same tier: ``slow`` is what ``-m "not slow"`` has always skipped."""

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
PRODUCT_PACKAGES = ("charts", "infra", "raytrain_eks", "training", "environment", "devtools", "app")
PROCESS_MODULES = ("subprocess", "multiprocessing", "torch.multiprocessing", "concurrent.futures.process")
JSII_MODULES = ("aws_cdk", "cdk8s", "constructs", "jsii", "cdk_nag", "charts.imports")


def _is(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


@lru_cache(maxsize=None)
def _imports_jsii(module: str) -> bool:
    """Whether a product module's own source imports a jsii library (read, not imported)."""
    if _is(module, JSII_MODULES):
        return True
    if not _is(module, PRODUCT_PACKAGES):
        return False
    with contextlib.suppress(ImportError, ValueError, AttributeError):
        spec = importlib.util.find_spec(module)
        if spec and spec.origin and spec.origin.endswith(".py"):
            tree = ast.parse(Path(spec.origin).read_text())
            for node in ast.walk(tree):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(_is(name, JSII_MODULES) for name in names):
                    return True
    return False


def _module_tier(name: str) -> str:
    if _is(name, PROCESS_MODULES):
        return "subprocess"
    return "synth" if _imports_jsii(name) else "unit"


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _under(path: str | None, folder: Path) -> bool:
    return bool(path) and Path(path).resolve().is_relative_to(folder)


@lru_cache(maxsize=None)
def _references(code: types.CodeType) -> tuple[tuple[tuple[tuple[str, ...], ...], tuple[str, ...]], ...]:
    """What ``code`` and each code object nested in it refer to, in order: its imports (``(module,)``
    for ``import module``, ``(module, name)`` for a ``from module import name``) and its names.
    Read once per code object: the same helpers and fixtures serve many tests, and reading
    bytecode is the costliest step of the collection."""
    found = []
    for each in _codes(code):
        imports, module = [], None
        for ins in dis.get_instructions(each):
            if ins.opname == "IMPORT_NAME":
                module = ins.argval
                imports.append((module,))
            elif ins.opname == "IMPORT_FROM":
                imports.append((module, ins.argval))
        found.append((tuple(imports), each.co_names))
    return tuple(found)


def _function_tier(fn, seen: set, deep: bool) -> str:
    """The costliest tier that ``fn``'s code reaches: modules it imports or names, objects it
    names; ``deep`` (a function under tests/) also follows the functions it names."""
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None or code in seen:
        return "unit"
    seen.add(code)
    found = ["unit"]
    namespace = getattr(fn, "__globals__", {})
    for imports, names in _references(code):
        for imported in imports:
            if len(imported) == 1:
                found.append(_module_tier(imported[0]))
            elif imported[0] in sys.modules:  # a local `from x import y`
                found.append(_object_tier(getattr(sys.modules[imported[0]], imported[1], None), seen, deep))
        for name in names:
            if name in namespace:
                obj = namespace[name]
                if not deep and _same_file(obj, code):  # the product: its own module's helpers are "itself"
                    found.append(_function_tier(obj, seen, False))
                else:
                    found.append(_object_tier(obj, seen, deep))
    return max(found, key=TIERS.index)


def _same_file(obj, code: types.CodeType) -> bool:
    """Whether ``obj`` is a function defined in the file of ``code`` (a module's own helper)."""
    other = getattr(inspect.unwrap(obj), "__code__", None) if inspect.isfunction(obj) else None
    return other is not None and other.co_filename == code.co_filename


def _object_tier(obj, seen: set, deep: bool) -> str:
    if isinstance(obj, types.ModuleType):
        return _module_tier(obj.__name__)
    module = getattr(obj, "__module__", None) or ""
    if _is(module, PROCESS_MODULES) or _is(module, JSII_MODULES):
        return _module_tier(module) if _is(module, PROCESS_MODULES) else "synth"
    if inspect.isclass(obj):
        path = getattr(sys.modules.get(module), "__file__", None)
        if _under(path, TESTS) and deep:
            return _class_tier(obj, seen, True)
        if deep and _under(path, ROOT) and _is(module, PRODUCT_PACKAGES) and not _under(path, TESTS):
            return _class_tier(obj, seen, False)  # the product: one level, what it itself starts
        return "unit"
    code = getattr(inspect.unwrap(obj), "__code__", None) if callable(obj) else None
    if code is None:
        return "unit"
    if _under(code.co_filename, TESTS):
        return _function_tier(obj, seen, True) if deep else "unit"
    if deep and _under(code.co_filename, ROOT) and _is(module, PRODUCT_PACKAGES):
        return _function_tier(obj, seen, False)  # the product: one level, what it itself starts
    return "unit"


def _class_tier(cls, seen: set, deep: bool) -> str:
    members = [getattr(member, "__func__", member) for member in vars(cls).values()]  # class/static methods too
    return max((_function_tier(member, seen, deep) for member in members if inspect.isfunction(member)),
               key=TIERS.index, default="unit")


def _fixture_funcs(item: pytest.Item) -> Iterator:
    """The functions of the item's fixtures, and of those a parameter names (a fixture that
    takes another by ``request.getfixturevalue(request.param)``, as ``variant`` does)."""
    defs = dict(getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}))
    params = getattr(getattr(item, "callspec", None), "params", {})
    manager = item.session._fixturemanager
    for value in params.values():
        if isinstance(value, str) and value.isidentifier() and value not in defs:
            with contextlib.suppress(Exception):
                defs[value] = manager.getfixturedefs(value, item) or ()
    for fixturedefs in defs.values():
        for fixturedef in fixturedefs:
            yield fixturedef.func


def tier_of(item: pytest.Item) -> str:
    """The item's tier: the costliest of its markers, its fixtures and the code it runs."""
    found = ["unit"]
    for mark in item.iter_markers():
        name = ALIASES.get(mark.name, mark.name)
        if name in TIERS:
            found.append(name)
    names = getattr(item, "fixturenames", ())
    if set(RAY_FIXTURES) & set(names):
        found.append("ray")
    if set(CLUSTER_FIXTURES) & set(names):
        found.append("cluster")
    seen: set = set()
    if getattr(item, "function", None) is not None:
        found.append(_function_tier(item.function, seen, True))
    for func in _fixture_funcs(item):
        if _under(getattr(getattr(inspect.unwrap(func), "__code__", None), "co_filename", None), TESTS):
            found.append(_function_tier(func, seen, True))
    return max(found, key=TIERS.index)


def mark_tiers(items: list[pytest.Item]) -> None:
    """Give every item the marker of its tier (and ``slow`` to the ``ray`` tier, its old name)."""
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(tier)
        if tier == "ray" and item.get_closest_marker("slow") is None:
            item.add_marker("slow")


def _library_lookup(args: tuple, kwargs: dict) -> bool:
    """``ldconfig -p``: how the standard library's ``ctypes.util.find_library`` finds a shared
    library. PyPI's Linux torch (its CUDA build, the only one the polyglot machines get) runs it
    once per process at its first import (``cuda.pathfinder`` looks up ``libdl``), so whichever
    unit test imports torch first would be blamed for a process it did not start."""
    command = args[1] if len(args) > 1 else kwargs.get("args")
    return isinstance(command, (list, tuple)) and list(command[:2]) == ["/sbin/ldconfig", "-p"]


@contextlib.contextmanager
def unit_guard(item: pytest.Item) -> Iterator[None]:
    """While a ``unit`` test sets up and runs: starting a process (``subprocess``, ``os.fork``,
    ``os.posix_spawn``, ``os.system``, ``multiprocessing``: Ray starts through these too) or a
    jsii object (the CDK or cdk8s app) fails it, naming the marker it needs. Threads that ran
    before the test (a session's servers) are left alone: their work is not the test's."""
    if item.get_closest_marker("unit") is None:
        yield
        return
    before = {thread.ident for thread in threading.enumerate()}

    def refuse(what: str, tier: str, original):
        def call(*args, **kwargs):
            if threading.get_ident() in before and threading.current_thread() is not threading.main_thread():
                return original(*args, **kwargs)
            if _library_lookup(args, kwargs):
                return original(*args, **kwargs)
            pytest.fail(f"{item.nodeid} is in the unit tier but {what}: mark it "
                        f"pytest.mark.{tier} (tests/tiers.py, docs/testing.md)", pytrace=False)
        return call

    targets = [(subprocess.Popen, "__init__", "started a process", "subprocess"),
               (multiprocessing.process.BaseProcess, "start", "started a process", "subprocess")]
    targets += [(os, name, f"called os.{name}", "subprocess")
                for name in ("fork", "posix_spawn", "posix_spawnp", "system") if hasattr(os, name)]
    kernel = sys.modules.get("jsii._kernel")
    if kernel is not None:
        targets += [(kernel.Kernel, "create", "created a jsii object (the CDK or cdk8s app)", "synth")]
    with pytest.MonkeyPatch.context() as patch:
        for owner, name, what, tier in targets:
            patch.setattr(owner, name, refuse(what, tier, getattr(owner, name)))
        yield
