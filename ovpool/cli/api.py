"""``ovpool api``: the OpenAI-compatible HTTP API in front of a broker."""

from __future__ import annotations

from typing import Any

import click

from ovpool import endpoint
from ovpool.cli.common import (
    broker_option,
    resolve_settings,
    secret_option,
    server_key_option,
    settings_options,
    stop_on_signals,
)
from ovpool.config import ApiConfig


@click.command("api")
@broker_option
@click.option("--bind", default="127.0.0.1:8000", show_default=True, metavar="HOST:PORT",
              envvar="OVPOOL_HTTP_BIND", help="Where the HTTP API listens (env OVPOOL_HTTP_BIND).")
@click.option("--api-key", "api_keys", multiple=True, envvar="OVPOOL_API_KEY",
              help="A Bearer key clients must send (repeatable; env OVPOOL_API_KEY, comma-separated). "
                   "None: open, which only loopback should be.")
@secret_option
@server_key_option
@settings_options
def api_command(broker: str | None, bind: str, api_keys: tuple[str, ...], assignments: tuple[str, ...],
                **curve: Any) -> None:
    """Serve the OpenAI HTTP API (/v1/models, /v1/completions, /v1/chat/completions) via BROKER."""
    from ovpool.api import keys
    from ovpool.api.app import Config
    from ovpool.api.server import run

    api = ApiConfig.of(resolve_settings(assignments, broker=broker, **curve))
    endpoint.check(api.broker)  # now, not at the first request
    if api_keys and not keys.parse(api_keys):  # e.g. --api-key "$KEY" with KEY unset: not open
        raise click.BadParameter("it holds no key (empty): pass the key, or leave --api-key out to"
                                 " serve without keys", param_hint="--api-key")
    config = Config(api.broker, api.client, keys.ApiKeys(keys.parse(api_keys)), api.max_new_tokens,
                    shutdown_timeout_s=api.shutdown_timeout_s, max_connections=api.max_connections)
    with stop_on_signals() as stop:
        run(config, bind, stop)


def register(group: click.Group) -> None:
    group.add_command(api_command)
