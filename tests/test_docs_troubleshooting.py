"""docs/troubleshooting.md quotes ovpool's error messages as printed: each quoted message must still
be one the code can print, so that the page cannot go stale. Text only: the messages are matched
against the string literals of ovpool's sources (f-strings and %-formats split at their fields)."""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
DOC = (ROOT / "docs" / "troubleshooting.md").read_text()
PLACEHOLDER = re.compile(r"<[^<>]*>")  # the doc's "<endpoint>", "<n>": parts that differ per case
LOG_PREFIX = re.compile(r"^<time> (?:INFO|WARNING|ERROR) +[\w.]+\[<pid>\]: ")
PERCENT_FIELD = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrifgx]")
SEP = "\x00"


def _literal_parts(tree: ast.AST) -> list[str]:
    """Every run of literal text in ``tree``'s strings: a plain string split at its %-fields, an
    f-string split at its {fields}."""
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts += [v.value for v in node.values if isinstance(v, ast.Constant)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts += PERCENT_FIELD.split(node.value)
    return [p for p in parts if p]


@functools.cache
def _source_text() -> str:
    """All literal parts of ovpool's sources, each between SEPs (so a search can ask for a whole
    part, its start or its end)."""
    parts = [p for path in sorted((ROOT / "ovpool").rglob("*.py"))
             for p in _literal_parts(ast.parse(path.read_text(), str(path)))]
    return SEP + SEP.join(parts) + SEP


def _composed(text: str, first: bool = True) -> bool:
    """Whether ``text`` (a stretch of a message between placeholders) is one literal part's text
    or literal parts joined where one string ends and the next begins (a message built from pieces,
    as ``f"{what}{hint}"``): the first piece ends a part, the middle ones are whole parts, the last
    begins one."""
    src = _source_text()
    if (text in src) if first else (SEP + text in src):
        return True
    for cut in range(len(text) - 1, 0 if first else 1, -1):  # a later piece: 2 characters or more
        head = text[:cut]
        if ((head + SEP) if first else (SEP + head + SEP)) in src and _composed(text[cut:], first=False):
            return True
    return False


def _printable(message: str) -> bool:
    return all(_composed(piece) for piece in PLACEHOLDER.split(message) if piece)


def _quoted_messages() -> list[str]:
    """The messages of the page: each line of its ```text blocks (less `error: ` or a log line's
    prefix), and each error message of its ```json blocks."""
    messages = []
    for block in re.findall(r"```text\n(.*?)```", DOC, re.S):
        for line in block.strip().splitlines():
            messages.append(LOG_PREFIX.sub("", line.removeprefix("error: ")))
    for block in re.findall(r"```json\n(.*?)```", DOC, re.S):
        messages += [json.loads(line)["error"]["message"] for line in block.strip().splitlines()]
    return messages


def test_every_quoted_message_is_one_the_code_prints():
    messages = _quoted_messages()
    assert len(messages) >= 40
    stale = [m for m in messages if not _printable(m)]
    assert not stale, "quoted in docs/troubleshooting.md, no longer printed:\n" + "\n".join(stale)


def test_each_quoted_message_has_words_of_its_own():
    """A quote made mostly of placeholders would match anything."""
    thin = [m for m in _quoted_messages() if max(map(len, PLACEHOLDER.split(m))) < 12]
    assert not thin


def test_a_reworded_message_is_caught():
    real = ("cannot reach the broker at <endpoint>: no connection in <seconds> s; is `ovpool serve` "
            "(or `ovpool broker`) running there? (setting connect_timeout_s)")
    assert _printable(real)
    assert not _printable(real.replace("no connection in", "no connection within"))
    assert not _printable(real.replace("running there?", "running there?!"))
    assert not _printable("model <model> has <n> requests queued; retry later")
