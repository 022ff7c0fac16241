"""The ``ovpool`` command: a thin click layer; every subcommand calls the library.

Subcommands live in one module per topic; each module's ``register(group)`` adds its commands. A
module is imported only when one of its commands runs (or for ``--help``), so a worker's start does
not pay for the table printer, the cache tools or the benchmarks.
"""

from __future__ import annotations

import importlib

import click

from ovpool import logs
from ovpool.cli.common import EnvOption, run_cli
from ovpool.startup import defer_heavy_imports

# Each command and its module under ovpool/cli/ (which has register(group)).
COMMAND_MODULES = {"api": "api", "settings": "settings_cmd", "generate": "generate", "broker": "pool",
                   "worker": "pool",
                   "complete": "pool", "status": "status", "keys": "pool", "serve": "serve", "probe": "serve",
                   "cache": "cache", "bench": "bench", "drain": "drain", "restart": "drain"}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in COMMAND_MODULES and name not in self.commands:
            importlib.import_module(f"ovpool.cli.{COMMAND_MODULES[name]}").register(self)
        return self.commands.get(name)


@click.group(cls=_LazyGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--log-level", cls=EnvOption, default=None, envvar="OVPOOL_LOG_LEVEL",
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Log level (env OVPOOL_LOG_LEVEL; default INFO).")
@click.option("--log-json", cls=EnvOption, is_flag=True, default=None, envvar="OVPOOL_LOG_JSON",
              help="Log JSON lines instead of text (env OVPOOL_LOG_JSON).")
@click.version_option(package_name="ovpool")
def main(log_level: str | None, log_json: bool | None) -> None:
    """Serve GGUF language models on OpenVINO devices through a pool of worker processes."""
    logs.configure(log_level or "INFO", bool(log_json))


def entry(obj: object = None) -> None:
    """``obj``: the click context's object (the spare process hands its read-ahead models)."""
    defer_heavy_imports()
    run_cli(main, obj)
