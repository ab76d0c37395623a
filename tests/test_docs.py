"""The project's docs hold together: every relative link in README.md and docs/*.md names a
file that exists and, with a #fragment, a heading of that file (GitHub's anchors); the docs
index (docs/README.md) lists every page of docs/; every diagram is drawn from its current
source and shown somewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(path: Path) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped but for - and _,
    spaces become hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(path):
        if line.startswith("#"):
            base = anchor(line.lstrip("#"))
            n = seen.get(base, 0)
            found.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return found


def test_every_relative_link_resolves_to_a_file_and_a_heading():
    broken = []
    for page in PAGES:
        for line in prose(page):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                    continue
                path_part, _, fragment = target.partition("#")
                file = (page.parent / path_part).resolve() if path_part else page
                if not file.exists():
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
                elif fragment and file.suffix == ".md" and fragment not in anchors(file):
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == [], "\n".join(broken)


def test_the_docs_index_lists_every_page():
    index = (DOCS / "README.md").read_text()
    missing = [
        p.name
        for p in sorted(DOCS.glob("*.md"))
        if p.name != "README.md" and f"({p.name})" not in index
    ]
    assert missing == [], missing


def test_every_diagram_is_drawn_from_its_current_source_and_shown():
    """`make diagrams` stamps each SVG with its .dot's sha256: a source edited without
    drawing it again fails here (no Graphviz needed to check)."""
    import hashlib

    sources = sorted((DOCS / "diagrams").glob("*.dot"))
    assert sources
    shown = "".join(page.read_text() for page in PAGES)
    for source in sources:
        drawing = source.with_suffix(".svg")
        assert drawing.exists(), f"{drawing.name} missing: make diagrams"
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        stamp = f"<!-- source: {source.name} sha256 {digest} -->"
        assert stamp in drawing.read_text(), f"{drawing.name} is stale: make diagrams"
        assert f"diagrams/{drawing.name}" in shown, f"no page shows {drawing.name}"
