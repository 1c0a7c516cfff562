"""Every relative link of the repository's markdown resolves: the file or directory it names exists in the
repository (never a path outside it), and a `#fragment` names a heading of the target page as GitHub renders
its anchor. Web links (http, https, mailto) are not fetched."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", flags=re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def _pages() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True)
    return [REPO / name for name in listed.stdout.split() if "node_modules" not in name]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens, underscores kept), spaces -> '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.*)$", FENCE.sub("", page.read_text()), flags=re.MULTILINE)
    return {_anchor(heading) for heading in headings}


def _links(page: Path) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
    return [link for link in LINK.findall(text) if not re.match(r"^[a-z]+:", link)]


CASES = [(page, link) for page in _pages() for link in _links(page)]


def test_the_docs_have_links() -> None:
    assert len(CASES) > 50


@pytest.mark.parametrize(
    ("page", "link"), CASES, ids=[f"{page.relative_to(REPO)}: {link}"[:90] for page, link in CASES]
)
def test_link_resolves(page: Path, link: str) -> None:
    where = page.relative_to(REPO)
    path, _, fragment = link.partition("#")
    target = (page.parent / path).resolve() if path else page
    assert target.is_relative_to(REPO), f"{where}: {link} points outside the repository"
    assert target.exists(), f"{where}: {link} names nothing"
    if fragment and target.suffix == ".md":
        assert fragment in _anchors(target), f"{where}: {link}: no heading with anchor #{fragment}"
