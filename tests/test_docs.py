"""The README and docs/ as a reader meets them: the README short (each feature a line and a
link), and every link between the pages landing on a file and a heading that exist."""

import re
from pathlib import Path

import pytest

from parallel_kernels import knobs

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # no headings in code
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_the_readme_is_at_most_200_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 200


def test_every_link_between_pages_lands():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not this test's business
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert len(PAGES) > 10 and broken == []


def test_the_knob_table_in_the_docs_is_made_from_the_knob_rows():
    text = (REPO / "docs" / "sweeps.md").read_text()
    block = re.search(r"<!-- knobs:start[^>]*-->\n(.*)\n<!-- knobs:end -->", text, re.S)
    assert block and block.group(1) == knobs.docs_table()


@pytest.mark.unit
def test_every_docs_page_says_its_command_first():
    """A page opens with what it is for and the command (a fenced block in its first 30 lines),
    so that a reader who stops there can run it."""
    late = [
        p.name
        for p in sorted((REPO / "docs").glob("*.md"))
        if not any(line.startswith("```") for line in p.read_text().splitlines()[:30])
    ]
    assert late == []
