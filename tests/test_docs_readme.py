"""The README stays a page for users: short, with the commands a new user types (each one the CLI
and the Makefile still take as written) and the test command CI runs, and it links every page of
docs/."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from ovpool.cli import main

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


def _ovpool_commands(text: str) -> list[list[str]]:
    """Each `ovpool ...` command of the sh blocks and of inline code, as words."""
    inline = re.findall(r"`(ovpool [^`]+)`", text)
    return [c.split() for c in _sh_commands(text) + inline if c.startswith("ovpool ")]


def test_every_ovpool_command_it_shows_takes_its_flags():
    wrong = []
    for words in _ovpool_commands(README):
        command = words[1:3] if words[1] == "cache" else words[1:2]
        help_text = CliRunner().invoke(main, [*command, "--help"])
        flags = [w.split("=")[0] for w in words if w.startswith("--")]
        missing = [f for f in flags if f not in help_text.output]
        if help_text.exit_code or missing:
            wrong.append(f"{' '.join(words)}: exit {help_text.exit_code}, not in --help: {missing}")
    assert len(_ovpool_commands(README)) > 10
    assert not wrong, "\n".join(wrong)


def test_every_make_target_it_shows_is_in_the_makefile():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    shown = {c.split()[1] for c in _sh_commands(README) if c.startswith("make ")}
    assert shown and shown <= targets, shown - targets
