"""``ovpool settings``: every setting with its effective value and where it came from."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from ovpool.cli.common import emit_json, resolve_settings, settings_options


@click.command("settings")
@settings_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def settings_command(assignments: tuple[str, ...], as_json: bool) -> None:
    """Show every setting: effective value, source (flag/env/default), env var, graph-changing."""
    rows = resolve_settings(assignments).rows()
    if as_json:
        emit_json(rows)
        return
    table = Table(title="ovpool settings (flag > environment > default)")
    for col in ("name", "value", "source", "default", "env", "graph", "allowed / help"):
        table.add_column(col)
    for r in rows:
        allowed = ", ".join(r["choices"]) if r["choices"] else r["help"]
        table.add_row(r["name"], str(r["value"]), r["source"], str(r["default"]), r["env"],
                      "yes" if r["graph"] else "", allowed)
    Console(width=160).print(table)


def register(group: click.Group) -> None:
    group.add_command(settings_command)
