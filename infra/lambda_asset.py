"""Stage a Python Lambda asset: the function's package plus every package of this repository it
imports, found by following its imports, so the asset can never lack one.

A list of packages written by hand went stale once already: ``environment`` started importing
``spec_schema``, the asset did not carry it, and every run of the function ended in
``ModuleNotFoundError``. Here the import statements decide (``modulefinder`` reads them without
running the code, nested and relative imports included, every branch of an ``if``/``try``). The
synth fails, naming the module and the file that imports it, on an import that neither this
repository, the runtime's standard library nor the runtime's boto3 provides, and on an import by
a string (``importlib.import_module``, ``__import__``), which no reading of the code can follow.
"""
from __future__ import annotations

import ast
import modulefinder
import shutil
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
LAMBDA_RUNTIME_PACKAGES = frozenset({"boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six"})
"""What AWS's Python runtimes ship beside the standard library: the AWS SDK and its dependencies."""
REMOVED_FROM_THE_STANDARD_LIBRARY = frozenset({
    # Python 3.12 (What's New in Python 3.12, "Removed")
    "distutils", "imp", "asynchat", "asyncore", "smtpd",
    # Python 3.13 (PEP 594, the "dead batteries")
    "aifc", "audioop", "cgi", "cgitb", "chunk", "crypt", "imghdr", "mailcap", "msilib", "nis", "nntplib",
    "ossaudiodev", "pipes", "sndhdr", "spwd", "sunau", "telnetlib", "uu", "xdrlib", "lib2to3",
})
"""Modules of this machine's Python 3.11 that the Lambda runtime's newer Python no longer has: the
synth runs on 3.11, the function on the runtime's version (infra/stacks/pipeline_watcher.py)."""
_STRING_IMPORTS = {"import_module", "__import__"}


class UnshippableImport(ImportError):
    """A function imports something its asset cannot carry: a bug of this repository, found at synth."""


def _runtime_standard_library() -> frozenset[str]:
    return frozenset(sys.stdlib_module_names) - REMOVED_FROM_THE_STANDARD_LIBRARY


def _string_import(path: Path) -> int | None:
    """The line of the first import by a string in a module, if any."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name in _STRING_IMPORTS:
                return node.lineno
    return None


def first_party_packages(function_dir: Path, entry_modules: list[str]) -> dict[str, Path]:
    """The repository packages (top-level name -> folder) that the entry modules (``function_dir``'s,
    named as the runtime imports them) need, directly or through each other, ``function_dir``
    itself excluded. Raises :class:`UnshippableImport` when a module cannot be shipped."""
    finder = modulefinder.ModuleFinder(path=[str(function_dir.parent), str(REPO_ROOT)])
    for module in entry_modules:
        finder.import_hook(module)
    packages: dict[str, Path] = {}
    for name, module in finder.modules.items():
        if not module.__file__:  # a built-in module; the finder's path holds only our folders
            continue
        origin = Path(module.__file__).resolve()
        if (line := _string_import(origin)) is not None:
            raise UnshippableImport(f"{function_dir.name}: {name} line {line} imports by a string, which the asset "
                                    "cannot follow: import the module by name")
        if "." not in name:  # a top-level package (or module): where it really lives, not where REPO_ROOT has one
            packages[name] = origin.parent if origin.name == "__init__.py" else origin
    # A bad "package.name" that starts with a found package is `from package import name` of a
    # name that is not a module: an attribute, not a missing file.
    provided = set(packages) | LAMBDA_RUNTIME_PACKAGES | _runtime_standard_library()
    missing = sorted((name, sorted(importers)) for name, importers in finder.badmodules.items()
                     if name.split(".")[0] not in provided)
    if missing:
        name, importers = missing[0]
        raise UnshippableImport(
            f"{function_dir.name}: {importers[0]} imports {name!r}, which neither this repository, the Lambda "
            f"runtime's standard library nor its SDK ({', '.join(sorted(LAMBDA_RUNTIME_PACKAGES))}) provides: "
            "vendor it into the asset or drop the import")
    packages.pop(function_dir.name, None)
    return dict(sorted(packages.items()))


def stage_function(function_dir: Path, entry_modules: list[str], into: Path) -> Path:
    """``into/<function>``: a folder holding ``function_dir`` as a package and the repository
    packages it needs, every file readable by the runtime's user. Staged under the cloud assembly
    (not a temporary folder) so that a synth with asset staging disabled, which points the
    template at this folder itself, still finds it afterwards; its content, not its path, decides
    the asset hash, so a change to any of the packages redeploys the function."""
    out = into / function_dir.name
    shutil.rmtree(out, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(function_dir, out / function_dir.name, ignore=ignore)
    for name, source in first_party_packages(function_dir, entry_modules).items():
        if source.is_dir():
            shutil.copytree(source, out / name, ignore=ignore)
        else:
            shutil.copy2(source, out / source.name)
    # Lambda runs the code as another user than the one who checked it out; a 0600 file from a
    # `umask 077` clone would fail at import there and nowhere here.
    for path in out.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return out
