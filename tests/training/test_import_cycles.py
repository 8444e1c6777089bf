"""No import cycle through the run's modules (the driver, the loop, the record and its figures).

Every import counts, also one inside a function (a deferred import is still a dependency, as in
tests/test_layers.py): a module is in a cycle when it reaches itself through the imports of the
training package's files.
"""
from __future__ import annotations

import ast

from test_layers import ROOT, _imported_modules

RUN_MODULES = ("training.launch", "training.loop", "training.run_record", "training.metrics",
               "training.metric_sinks.prometheus", "training.verdict", "training.contract",
               "training.transport")


def module_graph(package: str = "training") -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (a ``from m import name`` of a name that
    is no module counts as an import of ``m``)."""
    files = {p.relative_to(ROOT).as_posix().removesuffix(".py").replace("/", ".").removesuffix(".__init__"): p
             for p in sorted((ROOT / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _imported_modules(node, module, path.name == "__init__.py"):
                while target and target not in files and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in files and target != module:
                    targets.add(target)
        graph[module] = targets
    return graph


def cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """One import path from ``start`` back to itself, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def test_no_run_module_imports_itself_through_others():
    graph = module_graph()
    found = {m: c for m in RUN_MODULES if (c := cycle_through(graph, m))}
    assert found == {}, "\n".join(" -> ".join(c) for c in found.values())
