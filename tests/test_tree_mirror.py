"""tests/ mirrors the tree: the tests of a module sit under ``tests/<its folder>/``, so the tests
of any file are found from its path. Only the cross-cutting folders below stand apart; top-level
``tests/test_*.py`` cut across packages (drift, layers, the shipped jobs, this file)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
CROSS_CUTTING = {
    "e2e": "the demo and `submit --local` end to end",
    "validation": "the battery of bad inputs, each by the fastest entry point that sees it",
    "fixtures": "the tests' input files",
    "cluster": "the Kubernetes layer against a real control plane (the cluster tier)",
}


def _folders(base: Path) -> list[Path]:
    """The folders of ``base`` that hold files: a folder git emptied by a move keeps only its
    ``__pycache__`` in a working tree, and is not part of the tree."""
    return sorted(p for p in base.iterdir() if p.is_dir() and p.name != "__pycache__" and not p.name.startswith(".")
                  and any(f.is_file() and "__pycache__" not in f.parts for f in p.rglob("*")))


def _code_folder(path: Path) -> bool:
    """A folder of the repository that holds Python code (a package or scripts, e.g. bench/)."""
    return path.is_dir() and any(path.glob("*.py"))


def test_every_test_folder_mirrors_a_code_folder_or_is_cross_cutting():
    stray = [f"tests/{d.name}" for d in _folders(TESTS)
             if d.name not in CROSS_CUTTING and not _code_folder(ROOT / d.name)]
    assert stray == [], f"not a code folder of the repository nor one of {sorted(CROSS_CUTTING)}: {stray}"


def test_every_nested_folder_of_test_modules_mirrors_a_folder_of_its_package():
    # helper folders (snapshots, oracles) hold no test modules and need no counterpart
    stray = []
    for top in _folders(TESTS):
        if top.name in CROSS_CUTTING:
            continue
        for folder in top.rglob("*"):
            if (folder.is_dir() and "__pycache__" not in folder.parts and any(folder.glob("test_*.py"))
                    and not (ROOT / folder.relative_to(TESTS)).is_dir()):
                stray.append(folder.relative_to(ROOT).as_posix())
    assert stray == [], f"test folders without a counterpart in the tree: {stray}"
