"""Every relative link in README.md and docs/*.md leads somewhere.

The README links to docs pages for detail it leaves out, and docs pages link to each other's
sections: a renamed page or heading must not leave a reader at a dead link. Links to files
must name a file in the repository; links with a ``#fragment`` to a Markdown page must name
one of its headings, as GitHub turns headings into anchors.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# [text](target) outside code spans; targets with a scheme (http:, mailto:) are not ours.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading's anchor, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    result: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        anchor = github_anchor(heading)
        count = seen.get(anchor, 0)
        result.add(anchor if count == 0 else f"{anchor}-{count}")
        seen[anchor] = count + 1
    return result


def relative_links(markdown: str) -> list[str]:
    """Link targets outside code blocks and code spans that point into the repository."""
    prose = CODE_SPAN.sub("", FENCE.sub("", markdown))
    return [t for t in LINK.findall(prose) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def broken_links(page: Path) -> list[str]:
    """The links of one page that name a missing file or a missing heading."""
    broken = []
    for target in relative_links(page.read_text()):
        path_part, _, fragment = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif (
            fragment
            and destination.suffix == ".md"
            and fragment not in anchors(destination.read_text())
        ):
            broken.append(f"{target}: no heading with that anchor")
    return broken


def test_github_anchor_drops_punctuation_and_code_marks() -> None:
    assert github_anchor("Share consumers (KIP-932)") == "share-consumers-kip-932"
    assert github_anchor("On one machine: `kafscale local --proxy`") == (
        "on-one-machine-kafscale-local---proxy"
    )
    assert github_anchor("Ports: below the kernel's ephemeral range") == (
        "ports-below-the-kernels-ephemeral-range"
    )


def test_anchors_number_repeated_headings() -> None:
    assert anchors("## Tests\n\n```\n# not a heading\n```\n\n### Tests\n") == {"tests", "tests-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []
