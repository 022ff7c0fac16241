"""docs/architecture.md's module table is the map of ovpool/: every module it names exists (a module
moved or renamed without its row fails here; a bare name in a cell is in the folder of the path before
it), and every module is on it, in a row of its own or named in its folder's row."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
TABLE = DOC[DOC.index("## Modules"):DOC.index("\n## ", DOC.index("## Modules") + 1)]


def named_modules(table: str) -> list[str]:
    """The paths of the first cell of each row, under ovpool/."""
    paths = []
    for row in table.splitlines():
        if not row.startswith("| `"):
            continue
        folder = ""
        for name in re.findall(r"`([\w/.]+)`", row.split("|")[1]):
            if "/" in name.rstrip("/"):
                folder = name.rsplit("/", 1)[0] + "/"
                paths.append(name)
            else:
                paths.append(name if name.endswith("/") else folder + name)
    return paths


def test_bare_names_are_in_the_folder_before_them():
    assert named_modules("| `worker/graph/builder.py`, `layers.py` | x |\n| `errors.py` | y |") == [
        "worker/graph/builder.py", "worker/graph/layers.py", "errors.py"]


def test_every_module_in_the_table_exists():
    paths = named_modules(TABLE)
    assert len(paths) > 50
    missing = [p for p in paths if not (ROOT / "ovpool" / p).exists()]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def mapped_modules(table: str) -> set[str]:
    """The rows' modules, and in a folder's row (`api/`) each `name.py` it names, as `api/name.py`."""
    paths = set(named_modules(table))
    for row in table.splitlines():
        for folder in re.findall(r"`([\w/]+/)`", row.split("|")[1]) if row.startswith("| `") else []:
            paths.update(folder + name for name in re.findall(r"`([\w/]+\.py)`", row))
    return paths


def test_a_folder_row_maps_the_modules_it_names():
    row = "| `api/`, `cli/bench.py` | the HTTP API: `app.py` (the app), `sse.py` |"
    assert mapped_modules(row) >= {"api/app.py", "api/sse.py", "cli/bench.py"}


def test_every_module_is_on_the_map():
    modules = {str(p.relative_to(ROOT / "ovpool")) for p in (ROOT / "ovpool").rglob("*.py")}
    packages = {m for m in modules if m.endswith("/__init__.py")}  # a subpackage's is its folder's
    missing = sorted(modules - packages - mapped_modules(TABLE))
    assert not missing, f"modules without a line in docs/architecture.md's module table: {missing}"
