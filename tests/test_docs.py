"""The documentation holds together: the README stays a user's guide of about 600 lines (the
design and the dated measurements live in docs/), and every relative link in README.md and
docs/*.md reaches a file that exists and, where it names one, a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

from bench.processes import ROOT

README_MAX_LINES = 650
# [text](target): a target with no scheme; images and reference-style links are not used.
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose(text: str) -> str:
    """The text outside fenced code blocks, where a bracket is code, not a link."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces as hyphens."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", _prose(path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_readme_is_a_users_guide_not_a_lab_notebook() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; move depth to docs/ and link it"
    )
    # The two commands stay on its first screen.
    assert any(line.startswith("make run ") for line in lines[:25])
    assert any(line.startswith("make test ") for line in lines[:25])


def test_relative_links_in_readme_and_docs_resolve() -> None:
    broken = []
    for page in _pages():
        for target in LINK.findall(_prose(page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(ROOT)}: {target}"
            if not linked.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)
