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
