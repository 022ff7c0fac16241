"""A benchmark side named on the command line: ``NAME[@TREE]=k=v,k=v``, the settings one side runs with.

The benchmarks that compare settings side by side take ``--side`` in this one form, parsed by
argparse (``type=side``, ``tree_side`` or ``named``) so that a malformed side is a usage error that names
the form, before any model loads. ``@TREE`` runs the side on another checkout (a ``git worktree`` of
the tree before a change), for the benchmarks that run each side in a subprocess.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from ovpool.errors import ConfigError
from ovpool.settings.resolved import parse_assignments

FORM = "NAME=k=v,k=v, e.g. plain=answer_tails=off or base= (no settings)"


@dataclass(frozen=True)
class Side:
    name: str
    assignments: tuple[str, ...] = ()  # "k=v" as ``--set`` takes them
    tree: str | None = None  # None: this checkout

    @property
    def settings(self) -> dict[str, str]:
        return dict(a.split("=", 1) for a in self.assignments)


def side(text: str) -> Side:
    """A side on this checkout, its setting names checked against this tree's registry."""
    parsed = named(text)
    if parsed.tree is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: this benchmark runs every side here: expected {FORM}")
    try:
        parse_assignments(parsed.assignments)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    return parsed


def tree_side(text: str) -> Side:
    """A side that may name another checkout (``NAME@TREE=...``), whose settings that tree checks."""
    parsed = named(text)
    if parsed.tree is None:
        return side(text)
    if not os.path.isdir(parsed.tree):
        raise argparse.ArgumentTypeError(f"{text!r}: {parsed.tree!r} is not a folder (NAME@TREE: a checkout)")
    return parsed


def named(text: str) -> Side:
    """``NAME=k=v,k=v`` with its keys unchecked (a GenAI peer's OpenVINO properties)."""
    head, sep, spec = text.partition("=")
    name, at, tree = head.partition("@")
    items = tuple(a for a in spec.split(",") if a)
    if not sep or not name or (at and not tree) or any(a.partition("=")[0] in ("", a) for a in items):
        raise argparse.ArgumentTypeError(f"{text!r}: expected {FORM}")
    return Side(name, items, tree or None)
