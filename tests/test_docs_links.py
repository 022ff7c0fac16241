"""Every relative link of README.md and docs/*.md leads somewhere: to a file of the repository and,
with a #fragment, to a heading of that page (as GitHub makes heading anchors)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces as -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {anchor(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_anchor_follows_github():
    assert anchor("Engine against GenAI (AVX-512 VNNI/BF16)") == "engine-against-genai-avx-512-vnnibf16"
    assert anchor("gemma3-270m against llama.cpp") == "gemma3-270m-against-llamacpp"
    assert anchor("The `decode_graph` setting") == "the-decode_graph-setting"


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in links(page):
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
