"""The docs as pages a reader can follow: none too long to read as one topic, and no relative
link (a file, or a heading in it) that leads nowhere. A page split or a heading renamed without
following its links fails here, not in a reader's browser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "AGENTS.md", *(ROOT / "docs").rglob("*.md")])

#: A topic per page: past this a page wants splitting (issue 27: "no page passes about 500").
MAX_LINES = 500

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (a link-shaped string in code is not a link)."""
    kept: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return "\n".join(kept)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose(page.read_text()).splitlines():
        if m := re.match(r"^#{1,6}\s+(.*)$", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def relative_links(page: Path) -> list[str]:
    return [
        target
        for target in _LINK.findall(_prose(page.read_text()))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, mailto: ...
    ]


def test_the_slug_is_githubs() -> None:
    assert slug("maf-sandbox route (the real node, runc and gVisor)") == (
        "maf-sandbox-route-the-real-node-runc-and-gvisor"
    )
    assert slug("No microVM here: the machine, and adding `Kata`") == (
        "no-microvm-here-the-machine-and-adding-kata"
    )


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    """The check below can fail: a link to a missing heading is listed."""
    (tmp_path / "a.md").write_text("# A\n\n## Real heading\n\nsee [b](a.md#no-such-heading)\n")
    page = tmp_path / "a.md"
    assert relative_links(page) == ["a.md#no-such-heading"]
    assert "no-such-heading" not in anchors(page)
    assert "real-heading" in anchors(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_passes_the_length_of_one_topic(page: Path) -> None:
    lines = len(page.read_text().splitlines())
    assert lines <= MAX_LINES, (
        f"{page.relative_to(ROOT)} has {lines} lines (> {MAX_LINES}): split it by topic"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    broken: list[str] = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
