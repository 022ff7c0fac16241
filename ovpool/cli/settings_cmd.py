"""``ovpool settings``: every setting with its effective value and where it came from."""

from __future__ import annotations

import click

from ovpool.cli.common import emit_json, resolve_settings, settings_options


@click.command("settings")
@settings_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON (for programs) instead of a table.")
def settings_command(assignments: tuple[str, ...], as_json: bool) -> None:
    """Show every setting: effective value, source (flag/env/default), env var, graph-changing."""
    rows = resolve_settings(assignments).rows()
    if as_json:
        emit_json(rows)
        return
    from ovpool.cli.tables import print_table

    print_table("ovpool settings (flag > environment > default)",
                ("name", "value", "source", "default", "env", "graph", "allowed / help"),
                [(r["name"], _text(r["value"]), r["source"], _text(r["default"]), r["env"],
                  "yes" if r["graph"] else "",
                  f"{', '.join(r['choices'])}: {r['help']}" if r["choices"] else r["help"])
                 for r in rows],
                whole=("name", "env"))


def _text(value) -> str:
    return '""' if value == "" else str(value)

def register(group: click.Group) -> None:
    group.add_command(settings_command)
