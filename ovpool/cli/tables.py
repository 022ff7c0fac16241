"""Tables that fit the terminal, whatever its width.

The width is rich's own detection (the terminal's size; ``COLUMNS``; 80 when piped). Rich shrinks
a table too wide for it by cutting words (``ScaledDotProductAtt…``), so the column widths are
chosen here: every column at least as wide as its longest word (a ``whole`` column: its longest
line, e.g. an id a user copies), the room left shared out towards each column's natural width.
Where even that does not fit, each row is printed as a record (its first cell, then one wrapped
``column: value`` line per other cell), which reads at any width and never splits a word.
"""

from __future__ import annotations

import textwrap
from collections.abc import Collection, Sequence

from rich.console import Console
from rich.table import Table

# Rich's default table style: one border at the left edge, then per column two cells of padding
# and one border.
_EDGE, _PER_COLUMN = 1, 3
_SHORT = 32  # a record's "column: value" up to this long shares a line with others


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]],
                whole: Collection[str] = (), console: Console | None = None) -> None:
    """Print ``rows`` (strings; a cell may hold several lines) under ``columns``."""
    console = console or Console()
    widths = fit(columns, rows, whole, console.width)
    if widths is None:
        for line in records(title, columns, rows, console.width):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    table = Table(title=title)
    for name, width in zip(columns, widths, strict=True):
        table.add_column(name, width=width, no_wrap=name in whole)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def fit(columns: Sequence[str], rows: Sequence[Sequence[str]], whole: Collection[str],
        width: int) -> list[int] | None:
    """Column widths that keep every word whole within ``width``, or None if there are none."""
    cells = list(zip(columns, *rows, strict=True))
    natural = [max(_longest(c.splitlines()) for c in column) for column in cells]
    least = [most if name in whole else max(_longest(c.split()) for c in column)
             for name, most, column in zip(columns, natural, cells, strict=True)]
    spare = width - _EDGE - _PER_COLUMN * len(columns) - sum(least)
    if spare < 0:
        return None
    wanted = [most - low for most, low in zip(natural, least, strict=True)]
    if sum(wanted) <= spare:
        return natural
    return [low + want * spare // sum(wanted) for low, want in zip(least, wanted, strict=True)]


def records(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> list[str]:
    """Each row as its first cell, then its other cells as ``column: value``: the short ones packed
    on shared lines, the others on lines of their own, wrapped at ``width`` (a word longer than a
    line stays whole)."""
    lines = [title]
    for row in rows:
        lines.append(" ".join(row[0].split()))
        cells = [(name, " ".join(cell.split())) for name, cell in zip(columns[1:], row[1:], strict=True)
                 if cell.strip()]
        chunks = [f"{name}: {cell}" for name, cell in cells]
        lines += _packed([c for c in chunks if len(c) <= _SHORT], width)
        for chunk in chunks:
            if len(chunk) > _SHORT:
                lines += textwrap.wrap(chunk, width, initial_indent="  ", subsequent_indent="      ",
                                       break_long_words=False, break_on_hyphens=False)
    return lines


def _packed(chunks: Sequence[str], width: int) -> list[str]:
    """``chunks`` two spaces apart on as few lines (indented) as ``width`` allows."""
    lines: list[str] = []
    for chunk in chunks:
        if lines and len(lines[-1]) + 2 + len(chunk) <= width:
            lines[-1] += "  " + chunk
        else:
            lines.append("  " + chunk)
    return lines


def _longest(parts: Sequence[str]) -> int:
    return max((len(p) for p in parts), default=0)
