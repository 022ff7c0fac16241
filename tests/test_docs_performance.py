"""docs/performance.md's "At a glance" table copies its figures from the sections it links: a number
in a row that its sections do not hold was recomputed or mistyped, or its section lost it."""

from __future__ import annotations

import re
from pathlib import Path

from test_docs_links import anchor

DOC = Path(__file__).parents[1] / "docs" / "performance.md"
# A number standing alone, as a ratio too (1.2x, 1.2×) and either end of a range (0.9-1.0): not a
# digit of a name (SmolLM2, gemma3-270m, Q4_0, 1.1B).
NUMBER = re.compile(r"(?<![\w.,])\d+(?:[.,]\d+)*(?=x\b|(?![.,]?\w))")


def section(page: str, fragment: str) -> str:
    """The text under the heading whose anchor is fragment, down to the next heading of its level."""
    lines = page.splitlines()
    for i, line in enumerate(lines):
        heading = re.match(r"(#+) (.+)$", line)
        if heading and anchor(heading.group(2)) == fragment:
            level = len(heading.group(1))
            body = []
            for later in lines[i + 1:]:
                if (m := re.match(r"(#+) ", later)) and len(m.group(1)) <= level:
                    break
                body.append(later)
            return "\n".join(body)
    raise KeyError(fragment)


def glance_rows(page: str) -> list[tuple[str, str, list[str]]]:
    """(topic and class, figure, links) of each row of the "At a glance" table."""
    start = page.index("## At a glance")
    table = page[start:page.index("\n## ", start + 1)]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] not in ("topic", "---"):
            rows.append((f"{cells[0]}, {cells[2]}", cells[1], re.findall(r"\]\(([^)]+)\)", cells[5])))
    return rows


def sources(page: str, links: list[str]) -> str:
    text = ""
    for target in links:
        path, _, fragment = target.partition("#")
        linked = (DOC.parent / path).read_text() if path else page
        text += section(linked, fragment) if fragment else linked
    return text


def test_numbers_stand_alone():
    text = "SmolLM2 0.94× (85.1 vs 90.2), 7,242 req/s, 1.1x, 0.95-1.00×, gemma3-270m, Q4_0, 1.1B"
    assert NUMBER.findall(text) == ["0.94", "85.1", "90.2", "7,242", "1.1", "0.95", "1.00"]


def test_every_glance_row_links_a_section_that_holds_its_figures():
    page = DOC.read_text()
    rows = glance_rows(page)
    assert len(rows) > 20
    wrong = []
    for name, figure, links in rows:
        held = {n.replace(",", "") for n in NUMBER.findall(sources(page, links))}
        missing = [n for n in NUMBER.findall(figure) if n.replace(",", "") not in held]
        if not links or missing:
            wrong.append(f"{name}: {missing or 'no section linked'}")
    assert not wrong, "At a glance rows with figures their sections do not hold:\n" + "\n".join(wrong)
