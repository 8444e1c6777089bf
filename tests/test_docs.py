"""The documentation is reachable and its links hold: every page under docs/ is linked from
README.md or docs/layout.md (a page linked from nowhere is not read), and every relative link in
README.md and docs/ names a file that exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def links(page: Path) -> set[Path]:
    """The files a Markdown page links to (relative links; anchors dropped)."""
    found = set()
    for target in LINK.findall(page.read_text()):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        found.add((page.parent / target.split("#", 1)[0]).resolve())
    return found


def test_every_docs_page_is_linked_from_the_readme_or_the_layout():
    linked = links(ROOT / "README.md") | links(DOCS / "layout.md")
    assert PAGES and [p.name for p in PAGES if p.resolve() not in linked] == []


def test_every_relative_link_names_a_file_that_exists():
    broken = [f"{page.relative_to(ROOT)} -> {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}"
              for page in [ROOT / "README.md", *PAGES] for target in links(page) if not target.exists()]
    assert broken == []


# docs/layout.md is the map a newcomer reads first: every path it names must exist, and every
# module of the product must be on it (a module no row names is a room nobody can find).
LAYOUT = DOCS / "layout.md"
CODE_SPAN = re.compile(r"`([^`\s]+)`")
TOP_FOLDERS = ("app.py", "training/", "environment/", "infra/", "charts/", "raytrain_eks/", "spec_schema/",
               "tests/", "bench/", "devtools/", "scripts/", "jobs/", "docs/", "dashboards/")
PRODUCT = ("spec_schema", "environment", "training", "charts", "infra", "raytrain_eks")


def named_paths(text: str) -> tuple[set[str], set[str]]:
    """The repository paths a page names in code spans, and the bare ``*.py`` file names (a room's
    modules listed by name after their folder); templates (``<kind>.py``, ``*.toml``) left out."""
    paths, names = set(), set()
    for span in CODE_SPAN.findall(text):
        token = span.split(":")[0].rstrip(".,;)")
        if any(c in token for c in "<>*{$"):
            continue
        if token.startswith(TOP_FOLDERS):
            paths.add(token)
        elif token.endswith(".py") and "/" not in token:
            names.add(token)
    return paths, names


def product_modules() -> list[str]:
    found = [p for package in PRODUCT for p in (ROOT / package).rglob("*.py")
             if "__pycache__" not in p.parts and not p.relative_to(ROOT).as_posix().startswith("charts/imports/")]
    return sorted(p.relative_to(ROOT).as_posix() for p in found) + ["app.py"]


def test_every_path_the_layout_names_exists():
    paths, names = named_paths(LAYOUT.read_text())
    file_names = {p.name for package in (*PRODUCT, "tests", "bench", "devtools") for p in (ROOT / package).rglob("*.py")}
    assert paths and names
    assert sorted(p for p in paths if not (ROOT / p).exists()) == []
    assert sorted(n for n in names if n not in file_names) == []


def test_every_product_module_is_in_a_row_of_the_concept_table():
    text = LAYOUT.read_text()
    table = text[text.index("## The concepts a newcomer meets"):text.index("## Where a change goes")]
    where = {span for line in table.splitlines() if line.startswith("| ") and line.count("|") >= 4
             for span in CODE_SPAN.findall(line.split("|")[3])}
    rows = sum(1 for line in table.splitlines() if line.startswith("| ")) - 1  # the header
    unplaced = [m for m in product_modules() if not m.endswith("__init__.py")
                and not any(m == w or (w.endswith("/") and m.startswith(w)) for w in where)]
    assert unplaced == []
    stated = re.search(r"(\d+) ideas carry the whole project", text)  # the count the page states is the table's
    assert stated and int(stated.group(1)) == rows, (stated and stated.group(1), rows)


def test_a_stale_layout_path_is_named():
    assert named_paths("`training/gone.py`, `gone.py`, `training/data/formats/<kind>.py`, `jobs/*.toml`") == (
        {"training/gone.py"}, {"gone.py"})
    assert not (ROOT / "training/gone.py").exists()
