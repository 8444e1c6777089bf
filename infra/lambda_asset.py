"""Stage a Python Lambda asset: the function's package plus every package of this repository it
imports, found by following its imports, so the asset can never lack one.

A list of packages written by hand went stale once already: ``environment`` started importing
``spec_schema``, the asset did not carry it, and every run of the function ended in
``ModuleNotFoundError``. Here the import statements decide (``modulefinder`` reads them without
running the code, nested and relative imports included). An import that is neither this
repository's, the standard library's, nor provided by the Lambda runtime fails the synth, naming
the module and the file that imports it.
"""
from __future__ import annotations

import atexit
import modulefinder
import shutil
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
LAMBDA_RUNTIME_PACKAGES = frozenset({"boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six"})
"""What AWS's Python runtimes ship beside the standard library: the AWS SDK and its dependencies."""


class UnshippableImport(ImportError):
    """A function imports something its asset cannot carry: a bug of this repository, found at synth."""


def first_party_packages(function_dir: Path, entry_modules: list[str]) -> list[str]:
    """Top-level packages of this repository that the entry modules (``function_dir``'s, named as
    the runtime imports them) need, directly or through each other, besides ``function_dir``
    itself. Raises when one imports a module that neither this repository, the standard library
    nor the Lambda runtime provides."""
    finder = modulefinder.ModuleFinder(path=[str(function_dir.parent), str(REPO_ROOT)])
    for module in entry_modules:
        finder.import_hook(module)
    packages = {name.split(".")[0] for name, module in finder.modules.items()
                if module.__file__ and Path(module.__file__).resolve().is_relative_to(REPO_ROOT)}
    # A bad "package.name" that starts with a found package is `from package import name` of a
    # name that is not a module: an attribute, not a missing file.
    provided = packages | LAMBDA_RUNTIME_PACKAGES | set(sys.stdlib_module_names)
    missing = sorted((name, sorted(importers)) for name, importers in finder.badmodules.items()
                     if name.split(".")[0] not in provided)
    if missing:
        name, importers = missing[0]
        raise UnshippableImport(
            f"{function_dir.name}: {importers[0]} imports {name!r}, which neither this "
            f"repository, the standard library nor the Lambda runtime "
            f"({', '.join(sorted(LAMBDA_RUNTIME_PACKAGES))}) provides: vendor it into the asset or drop the import")
    return sorted(packages - {function_dir.name})


def stage_function(function_dir: Path, entry_modules: list[str]) -> Path:
    """A fresh folder holding ``function_dir`` as a package and the repository packages it needs.
    The folder's content (not its path) decides the asset hash, so a change to any of them
    redeploys the function. Removed when this process ends (CDK copies it into the assembly)."""
    out = Path(tempfile.mkdtemp(prefix=f"raytrain-{function_dir.name}-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(function_dir, out / function_dir.name, ignore=ignore)
    for package in first_party_packages(function_dir, entry_modules):
        shutil.copytree(REPO_ROOT / package, out / package, ignore=ignore)
    return out
