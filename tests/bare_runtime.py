"""A bare Python runtime for testing a shipped artifact in the form its real caller runs it: a
virtual environment of the base interpreter that holds ONLY the named distributions and what they
depend on, never this project (not even its editable install, which maps the whole repository
into the test venv's site-packages: ``python -I`` still reads those).

The distributions are linked from the test venv, so nothing downloads. What a runtime provides is
the caller's to name, e.g. AWS Lambda's Python runtimes: the standard library plus boto3
(``LAMBDA_RUNTIME`` below, infra/stacks/pipeline_watcher.py).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import venv
from importlib import metadata
from pathlib import Path

DLC_RUNTIME = ("torch", "ray", "transformers", "datasets", "accelerate", "tensorboardX", "pyarrow", "numpy",
               "safetensors")
"""The distributions the AWS Ray Train DLC provides that training/ may import (its release notes'
package set at Ray 2.58.0, PyTorch 2.13.0, Transformers 5.13.0), with their dependencies.
flash-attn is the DLC's too but GPU-only and not installable here: training/ imports it only on GPU.
No peft, trl, lm_eval, mlflow or wandb: the job must run without them."""

LAMBDA_RUNTIME = ("boto3",)
"""The distribution AWS Lambda's Python runtime provides beyond the standard library; with its
dependencies, the import names infra/stacks/pipeline_watcher.py's LAMBDA_RUNTIME_PACKAGES lists (a test)."""

# How AWS's runtime interface client calls a handler (aws-lambda-python-runtime-interface-client,
# awslambdaric/bootstrap.py `_get_handler`): the task root on sys.path, then
# `importlib.import_module(module)` and `getattr(module, function)` for handler "module.function",
# called with (event, context). The result is what the invocation returns (here: printed as JSON).
_LAMBDA_BOOTSTRAP = """
import importlib, json, os, sys
sys.path.insert(0, os.environ["LAMBDA_TASK_ROOT"])
module, _, function = os.environ["_HANDLER"].rpartition(".")
handler = getattr(importlib.import_module(module), function)
print(json.dumps(handler(json.loads(sys.argv[1]), None)))
"""


def _requirement_names(dist: metadata.Distribution) -> list[str]:
    names = []
    for requirement in dist.requires or []:
        if "extra ==" in requirement:
            continue
        names.append(re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0])
    return names


def distribution_closure(names: tuple[str, ...]) -> list[metadata.Distribution]:
    """The named distributions and every distribution they require (extras left out)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            # a requirement pip left out for this interpreter (its environment marker, e.g.
            # tomli's python_version < "3.11"): what the runtime's own resolver would do too
            continue
        seen[key] = dist
        todo.extend(_requirement_names(dist))
    return list(seen.values())


def importable_names(dist: metadata.Distribution) -> set[str]:
    """The top-level packages and modules a distribution installs."""
    return {entry.removesuffix(".py") for entry in _top_level_entries(dist)
            if not entry.endswith((".dist-info", ".pth")) and entry != "__pycache__"}


def _top_level_entries(dist: metadata.Distribution) -> set[str]:
    """The first path parts of a distribution's installed files (packages, modules, dist-info)."""
    return {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}


def make_runtime(where: Path, distributions: tuple[str, ...]) -> Path:
    """A venv at ``where`` holding the standard library and ``distributions`` (with their
    dependencies); returns its python. No pip: nothing can be installed into it by accident."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    python = where / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    for dist in distribution_closure(distributions):
        source = Path(str(dist.locate_file("")))
        for entry in _top_level_entries(dist):
            if not (site / entry).exists():
                (site / entry).symlink_to(source / entry)
    return python


def visible_project_packages(python: Path, cwd: Path) -> list[str]:
    """Which of this repository's packages ``python`` can import from ``cwd``: a bare runtime
    must see none of them."""
    probe = ("import importlib.util, json; print(json.dumps([m for m in "
             "('spec_schema', 'environment', 'training', 'charts', 'infra', 'raytrain_eks', 'devtools') "
             "if importlib.util.find_spec(m)]))")
    out = subprocess.run([str(python), "-c", probe], cwd=cwd, capture_output=True, text=True, check=True,
                         env=_clean_environ())
    return json.loads(out.stdout)


def invoke_lambda(python: Path, task_root: Path, handler: str, event: dict, environ: dict[str, str],
                  timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``handler`` from the staged asset folder as the Lambda runtime does (cwd and
    LAMBDA_TASK_ROOT the task root, the function's environment variables, nothing else)."""
    env = _clean_environ() | {"LAMBDA_TASK_ROOT": str(task_root), "_HANDLER": handler} | environ
    return subprocess.run([str(python), "-c", _LAMBDA_BOOTSTRAP, json.dumps(event)], cwd=task_root, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _clean_environ() -> dict[str, str]:
    """PATH and locale only: no PYTHONPATH, no virtual env, no AWS settings of the caller."""
    return {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TMPDIR", "HOME")}

