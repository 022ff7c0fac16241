"""The ``ovpool`` command: a thin click layer; every subcommand calls the library.

Subcommands live in one module per topic; each module's ``register(group)`` adds its commands.
"""

from __future__ import annotations

import importlib

import click

from ovpool import logs
from ovpool.cli.common import run_cli

# One module per topic under ovpool/cli/, each with register(group).
_COMMAND_MODULES = ("settings_cmd", "generate", "pool", "serve", "cache", "bench")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--log-level", default=None, envvar="OVPOOL_LOG_LEVEL",
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Log level (env OVPOOL_LOG_LEVEL; default INFO).")
@click.option("--log-json", is_flag=True, default=None, envvar="OVPOOL_LOG_JSON",
              help="Log JSON lines instead of text (env OVPOOL_LOG_JSON).")
@click.version_option(package_name="ovpool")
def main(log_level: str | None, log_json: bool | None) -> None:
    """Serve GGUF language models on OpenVINO devices through a pool of worker processes."""
    logs.configure(log_level, log_json)


for _name in _COMMAND_MODULES:
    importlib.import_module(f"ovpool.cli.{_name}").register(main)


def entry() -> None:
    run_cli(main)
