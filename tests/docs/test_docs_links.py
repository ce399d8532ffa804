"""The README stays a front page, and no link in the docs leads nowhere.

Every relative link and ``#anchor`` in README.md and docs/**/*.md must resolve: the file exists,
and an anchor matches a heading of the target as GitHub slugs it. The reference pages under
docs/reference/ are generated elsewhere; that they exist is checked on its own
(``test_reference_pages_linked_from_docs_exist``), and the other tests check links into them
only for their anchors once they exist, so one missing generated page fails one test, by name.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.servers import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 200

#: The generated reference pages the docs link to.
REFERENCE_PAGES = (
    "docs/reference/http-api.md",
    "docs/reference/configuration.md",
    "docs/reference/cli.md",
    "docs/reference/metrics.md",
    "docs/reference/errors.md",
)

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def pages() -> list[Path]:
    return [README, *sorted(p for p in DOCS.rglob("*.md"))]


def prose(path: Path) -> list[str]:
    """The lines outside fenced code blocks (a link in a code block is text)."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup and punctuation dropped, lower case, spaces to
    hyphens (``Quickstart (10 minutes)`` -> ``quickstart-10-minutes``)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())  # backticks, stars, punctuation go
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in ``path`` (repeats get -1, -2 as on GitHub)."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(path):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    found: list[str] = []
    for line in prose(path):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is text too
        found += _LINK.findall(line) + _IMAGE.findall(line)
    return found


def broken_links(path: Path) -> list[str]:
    """The links of ``path`` that lead nowhere; links into a reference page that does not
    exist yet are left to ``test_reference_pages_linked_from_docs_exist``."""
    broken = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        relative = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
        if not dest.exists():
            if relative not in REFERENCE_PAGES:
                broken.append(f"{target} (no such file)")
            continue
        if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target} (no heading #{fragment} in {relative})")
    return broken


def test_the_readme_is_a_front_page_of_at_most_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)


def test_every_relative_link_and_anchor_in_the_readme_and_docs_resolves() -> None:
    broken = {p.relative_to(REPO).as_posix(): b for p in pages() if (b := broken_links(p))}
    assert broken == {}


def test_every_docs_page_is_reachable_from_the_docs_map() -> None:
    """docs/index.md links every page under docs/ (the generated references included)."""
    index = DOCS / "index.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for t in links(index)}
    missing = [p.relative_to(REPO).as_posix() for p in DOCS.rglob("*.md")
               if p != index and p.resolve() not in linked]
    assert missing == []


def test_reference_pages_linked_from_docs_exist() -> None:
    """The generated references the docs link to are in the tree (they are written by their
    generators, not by hand), and their index is the only other page there."""
    linked = {(p.parent / t.partition("#")[0]).resolve().relative_to(REPO).as_posix()
              for p in pages() for t in links(p) if "reference/" in t}
    assert linked == {*REFERENCE_PAGES, "docs/reference/README.md"}
    assert [page for page in REFERENCE_PAGES if not (REPO / page).is_file()] == []


def test_the_link_checker_catches_a_missing_file_and_a_wrong_anchor(tmp_path: Path) -> None:
    assert "quickstart-10-minutes" in anchors(README)
    assert "the-write-path-on-postgresql-and-its-ceiling" in anchors(DOCS / "concepts" / "audit.md")
    assert slug("The CLI (`cpctl`)") == "the-cli-cpctl"
    assert slug("**Who** a federated_person becomes") == "who-a-federated_person-becomes"
    (tmp_path / "chain.md").write_text("# The chain\n\n```sh\n# not a heading\n```\n")
    probe = tmp_path / "probe.md"
    probe.write_text("[a](chain.md#no-such-heading) [b](nowhere.md) [c](chain.md#the-chain)\n"
                     "[d](chain.md#not-a-heading) `[e](in-code.md)`\n")
    assert broken_links(probe) == [
        f"chain.md#no-such-heading (no heading #no-such-heading in {tmp_path / 'chain.md'})",
        "nowhere.md (no such file)",
        f"chain.md#not-a-heading (no heading #not-a-heading in {tmp_path / 'chain.md'})",
    ]
