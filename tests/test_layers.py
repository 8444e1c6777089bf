"""The import direction between the repository's packages, enforced.

Layers (lowest first):

- ``spec_schema``: the schema engine of both TOML files; the standard library only, nothing of
  the repository.
- ``environment``: the environment spec; the standard library and ``spec_schema`` only.
- ``training``: the job that runs in the DLC; ``spec_schema``, nothing of ``environment``, ``infra``, ``charts``,
  the CLI or the developer tooling. Its ``config``, ``config_sections``, ``config_checks``, ``contract``,
  ``model_config`` modules and its ``storage`` package's ``__init__`` are standard-library
  only, because ``charts`` imports them.
- ``charts``: may import ``environment`` and training's stdlib-only modules; never ``infra``,
  the CLI or the developer tooling.
- ``infra``: may import ``environment`` and itself; never ``charts``, ``training``, the CLI or
  the developer tooling.
- ``raytrain_eks`` (the operator CLI): everything but the developer tooling.
- ``devtools`` (demo, local services, tokenizer builder), ``bench`` and ``tests``: anything.

Every ``import`` counts, also one inside a function: a deferred import is still a dependency.
An import inside ``try: ... except ImportError`` (a back-up import that hides a missing layer)
is refused everywhere. A violation fails with ``file:line: what``.

Inside each package the files form no cycle either (a module importing one that imports it
back, directly or through others, TYPE_CHECKING imports included): a cycle means neither file
can be read, tested or moved alone.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("spec_schema", "environment", "training", "charts", "infra", "raytrain_eks", "devtools")
TRAINING_STDLIB_MODULES = ("training.config", "training.config_sections", "training.config_checks", "training.contract",
                           "training.model_config", "training.storage")
STDLIB_PACKAGES = ("spec_schema", "environment")
ALLOWED: dict[str, set[str]] = {
    "spec_schema": {"spec_schema"},
    "environment": {"environment", "spec_schema"},
    "training": {"training", "spec_schema"},
    "charts": {"charts", "environment", "training", "spec_schema"},  # training: only its stdlib modules (below)
    "infra": {"infra", "environment", "spec_schema"},
    "raytrain_eks": {"raytrain_eks", "environment", "training", "charts", "infra", "spec_schema"},
    "devtools": set(PACKAGES),
}
GENERATED = ("charts/imports/",)


def _imported_modules(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:  # relative: resolve against this module's package
            parts = module.split(".") if is_package else module.split(".")[:-1]
            base = ".".join(parts[: len(parts) - node.level + 1])
            target = f"{base}.{node.module}" if node.module else base
        else:
            target = node.module or ""
        # `from training import contract` imports the module training.contract
        return [f"{target}.{alias.name}" for alias in node.names] if target in PACKAGES else [target]
    return []


def _backup_import_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers):
            lines |= {n.lineno for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return lines


def check_source(rel: str, source: str) -> list[str]:
    """Violations of one file, as ``rel:line: message`` lines."""
    package = rel.split("/", 1)[0]
    if package not in ALLOWED or rel.startswith(GENERATED):
        return []
    module = rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    tree = ast.parse(source, filename=rel)
    backups = _backup_import_lines(tree)
    problems = []
    for node in ast.walk(tree):
        for target in _imported_modules(node, module, rel.endswith("__init__.py")):
            top = target.split(".")[0]
            where = f"{rel}:{node.lineno}"
            if node.lineno in backups:
                problems.append(f"{where}: back-up import of {target} (an import that may fail hides a layer)")
            if top in PACKAGES:
                if top not in ALLOWED[package]:
                    problems.append(f"{where}: {package} may not import {top} ({target})")
                elif package == "charts" and top == "training" and target not in TRAINING_STDLIB_MODULES:
                    problems.append(f"{where}: charts may import only {', '.join(TRAINING_STDLIB_MODULES)} of training"
                                    f" ({target})")
            elif (package in STDLIB_PACKAGES or module in TRAINING_STDLIB_MODULES) and top and \
                    top not in sys.stdlib_module_names and top != "__future__":
                problems.append(f"{where}: {module} must import only the standard library ({target})")
    return problems


def repository_files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for path in repository_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(GENERATED):
            continue
        package = rel.split("/", 1)[0]
        module = rel.removesuffix(".py").replace("/", ".")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _imported_modules(node, module, rel.endswith("__init__.py")):
                top = target.split(".")[0]
                if top in PACKAGES and top != package:
                    graph[package].add(top)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def module_graph() -> dict[str, set[str]]:
    """``module -> the modules of its own package it imports`` for every repository file (a
    ``from pkg import name`` of a submodule counts as that submodule)."""
    modules = {}
    for path in repository_files():
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(GENERATED):
            modules[rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = _imported_modules(node, module, is_package)
            if isinstance(node, ast.ImportFrom):
                base = targets[0] if len(targets) == 1 and targets[0] not in PACKAGES else None
                if base is not None:  # `from training.data import check`: the submodule if it is one
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != module and target.split(".")[0] == module.split(".")[0]:
                    graph[module].add(target)
    return graph


def test_no_file_imports_itself_back_inside_a_package():
    found = cycles(module_graph())
    assert found == [], "\n" + "\n".join(" -> ".join(c) for c in found)


def test_every_import_follows_the_layers():
    problems = [p for path in repository_files()
                for p in check_source(path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))]
    assert problems == [], "\n" + "\n".join(problems)


def test_the_package_graph_has_no_cycle():
    graph = package_graph()
    assert cycles(graph) == [], graph
    # And the layers are what the rules say, not merely allowed: infra and charts never meet.
    assert "charts" not in graph["infra"] and "infra" not in graph["charts"]


def test_a_violation_is_reported_with_file_and_line():
    # Each rule, broken once: the checker names the file, the line and the rule.
    assert check_source("infra/stacks/x.py", "import os\nfrom charts.provenance import Provenance\n") == [
        "infra/stacks/x.py:2: infra may not import charts (charts.provenance)"]
    assert check_source("training/loop.py", "def f():\n    from environment import Environment\n") == [
        "training/loop.py:2: training may not import environment (environment.Environment)"]
    assert check_source("charts/jobs.py", "from training import loop\n") == [
        "charts/jobs.py:1: charts may import only training.config, training.config_sections, training.config_checks, "
        "training.contract, training.model_config, training.storage of training (training.loop)"]
    assert check_source("charts/jobs.py", "from training import contract\nfrom training.config import JobConfig\n") == []
    assert check_source("environment/model.py", "import yaml\n") == [
        "environment/model.py:1: environment.model must import only the standard library (yaml)"]
    assert check_source("training/contract.py", "import torch\n") == [
        "training/contract.py:1: training.contract must import only the standard library (torch)"]
    assert check_source("charts/main.py", "try:\n    import infra\nexcept ImportError:\n    infra = None\n") == [
        "charts/main.py:2: back-up import of infra (an import that may fail hides a layer)",
        "charts/main.py:2: charts may not import infra (infra)"]
    assert check_source("raytrain_eks/cli.py", "from devtools import demo\n") == [
        "raytrain_eks/cli.py:1: raytrain_eks may not import devtools (devtools.demo)"]
    assert check_source("infra/lambdas/image_watcher/watcher.py", "from .registry import resolve_digest\n") == []
    assert cycles({"a": {"b"}, "b": {"a"}}) and not cycles({"a": {"b"}, "b": set()})
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert check_source("spec_schema/__init__.py", "import yaml\n") == [
        "spec_schema/__init__.py:1: spec_schema must import only the standard library (yaml)"]
    assert check_source("spec_schema/__init__.py", "from environment import SpecError\n") == [
        "spec_schema/__init__.py:1: spec_schema may not import environment (environment.SpecError)"]


# training/'s rooms (a top-level module or a subpackage), lowest first. A room imports only the
# rooms of its own layer or a lower one: an import from a lower room back up is refused, so each
# room can be read and tested with only what is below it.
TRAINING_ROOMS: tuple[tuple[str, ...], ...] = (
    ("contract", "config_checks"),           # the shared vocabulary (standard library)
    ("storage", "model_config", "model_transforms", "objectives"),  # where files live; what a model is; its plug-ins; the loss
    ("config_sections",),                                 # the job config's sections
    ("config",),                                          # the job config
    ("data", "model", "flops", "verdict", "mlflow_rest", "incidents"),  # inputs, the model, figures, judgement, MLflow's API, faults
    ("checkpointing", "evaluation", "parallel", "optim", "metrics", "transport", "health_gate"),
    ("metric_sinks", "run_logs", "run_record", "run_facts", "watchdog"),
    ("loop",),                                            # the worker's training loop
    ("launch",),                                          # the driver
    ("netcheck",),                                        # a job kind built on the driver
    ("__main__",),                                        # the entry point
)


# infra/'s rooms, lowest first: the Lambda's code (shipped alone: nothing of CDK), the two helpers
# every stack uses, the constructs, the stacks, the app builder. A construct never imports a stack:
# the stacks compose constructs, and a construct that reached up into a stack could not be built
# without it.
INFRA_ROOMS: tuple[tuple[str, ...], ...] = (
    ("lambdas",),
    ("nag", "verify_gate"),
    ("constructs",),
    ("stacks",),
    ("build",),
)


def room_of(module: str, package: str = "training") -> str:
    """``training.data.records`` -> ``data``; ``training`` (the package itself) or a module of
    another package -> ``""``."""
    return module.split(".")[1] if module.startswith(package + ".") else ""


def upward_imports(graph: dict[str, set[str]], rooms: tuple[tuple[str, ...], ...], package: str = "training") -> list[str]:
    """``module -> target`` for every import of a room in a higher layer (or of no declared room)."""
    layer = {room: i for i, group in enumerate(rooms) for room in group}
    found = []
    for module in sorted(graph):
        if not module.startswith(package + "."):
            continue
        for target in sorted(graph[module]):
            mine, theirs = room_of(module, package), room_of(target, package)
            if theirs and mine != theirs and (mine not in layer or theirs not in layer or layer[theirs] > layer[mine]):
                found.append(f"{module} ({mine}) -> {target} ({theirs})")
    return found


def room_graph(graph: dict[str, set[str]], package: str = "training") -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module.startswith(package + "."):
            mine = room_of(module, package)
            rooms.setdefault(mine, set()).update(
                room_of(t, package) for t in targets if room_of(t, package) and room_of(t, package) != mine)
    return {room: targets for room, targets in rooms.items() if room}


def test_training_rooms_import_only_downwards_and_form_no_cycle():
    graph = module_graph()
    declared = {room for group in TRAINING_ROOMS for room in group}
    present = {room_of(m) for m in graph if m.startswith("training.")} - {"assets"}
    assert present - declared == set(), f"rooms of training/ missing from TRAINING_ROOMS: {sorted(present - declared)}"
    assert upward_imports(graph, TRAINING_ROOMS) == []
    rooms = room_graph(graph)
    assert cycles({room: rooms.get(room, set()) & set(rooms) for room in rooms}) == []


def test_an_upward_import_between_rooms_is_named():
    # The checks fail on the imports issue 49 found climbing back up.
    graph = {"training.data": {"training.checkpointing.storage"}, "training.checkpointing.storage": set(),
             "training.model_transforms.lora": {"training.checkpointing.state"}, "training.checkpointing.state": set()}
    assert upward_imports(graph, TRAINING_ROOMS) == [
        "training.data (data) -> training.checkpointing.storage (checkpointing)",
        "training.model_transforms.lora (model_transforms) -> training.checkpointing.state (checkpointing)"]
    assert cycles(room_graph({"training.tokenizer": {"training.data.records"},
                              "training.data.tokenizer": {"training.tokenizer"}})) == [["data", "tokenizer", "data"]]


def test_infra_rooms_import_only_downwards():
    graph = module_graph()
    declared = {room for group in INFRA_ROOMS for room in group}
    present = {room_of(m, "infra") for m in graph if m.startswith("infra.")}
    assert present - declared == set(), f"rooms of infra/ missing from INFRA_ROOMS: {sorted(present - declared)}"
    assert upward_imports(graph, INFRA_ROOMS, "infra") == []
    rooms = room_graph(graph, "infra")
    assert cycles({room: rooms.get(room, set()) & set(rooms) for room in rooms}) == []


def test_a_construct_importing_a_stack_is_named():
    # What infra/constructs/pod_identity.py did until the pipeline's group name moved out of
    # infra/stacks (to environment/contract.py).
    graph = {"infra.constructs.pod_identity": {"infra.stacks.pipeline_access", "infra.nag"},
             "infra.stacks.pipeline_access": {"infra.constructs.submitter_access"}}
    assert upward_imports(graph, INFRA_ROOMS, "infra") == [
        "infra.constructs.pod_identity (constructs) -> infra.stacks.pipeline_access (stacks)"]
    # the Lambda's code shipped alone: a reach into the CDK helpers is named too
    assert upward_imports({"infra.lambdas.image_watcher.watcher": {"infra.nag"}}, INFRA_ROOMS, "infra") == [
        "infra.lambdas.image_watcher.watcher (lambdas) -> infra.nag (nag)"]


def bench_graph() -> dict[str, set[str]]:
    """``script -> the bench scripts it imports`` (bench/ is a folder of scripts on sys.path, so
    they import each other by bare name)."""
    scripts = {p.stem: p for p in sorted((ROOT / "bench").glob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in scripts}
    for name, path in scripts.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _imported_modules(node, name, False):
                if target.split(".")[0] in scripts and target.split(".")[0] != name:
                    graph[name].add(target.split(".")[0])
    return graph


def test_bench_scripts_form_no_cycle():
    graph = bench_graph()
    assert any(graph.values()), "bench/ scripts import each other: the graph cannot be empty"
    assert cycles(graph) == [], graph
