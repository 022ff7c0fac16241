"""The README stays a page for users: short, with the commands a new user types and the test
command CI runs, and it links every page of docs/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()


def _sh_commands(text: str) -> list[str]:
    return [line.split("#")[0].strip() for block in re.findall(r"```sh\n(.*?)```", text, re.S)
            for line in block.splitlines() if line.split("#")[0].strip()]


def test_readme_is_short():
    assert len(README.splitlines()) <= 200


def test_readme_shows_the_test_command_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    [command] = [line.strip() for line in ci.splitlines() if line.strip().startswith("make ")]
    assert command in _sh_commands(README)


def test_readme_says_how_to_install_and_reach_the_command():
    commands = _sh_commands(README)
    assert "make setup" in commands and "source .venv/bin/activate" in commands
    assert "setup:" in (ROOT / "Makefile").read_text()


def test_readme_links_every_page_of_docs():
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)", README))
    assert pages <= linked, pages - linked
