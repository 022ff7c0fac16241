"""``ovpool drain [WORKER]`` and ``ovpool restart --rolling``: deploying changes without dropping
requests; and the signals of ``ovpool serve`` that do the same (docs/operations.md, "Deploying
changes without dropping requests")."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from ovpool.cli.common import (
    broker_option,
    parse_assignments,
    resolve_settings,
    secret_option,
    server_key_option,
)
from ovpool.errors import ConfigError
from ovpool.serve import state


def restart_file(state_file: str | Path) -> Path:
    """Where `ovpool restart --rolling --set ...` leaves the settings for serve (beside its state)."""
    return Path(f"{state_file}.restart")


@contextlib.contextmanager
def serve_signals(state_file: str | None) -> Iterator[Any]:
    """serve's Orders: SIGTERM or SIGINT drains (a second one stops at once), SIGHUP rolls."""
    from ovpool.serve.conductor import Orders

    orders = Orders(restart_file=restart_file(state_file) if state_file else None)

    def on_stop(*_: object) -> None:
        (orders.stop if orders.drain.is_set() else orders.drain).set()

    handlers = {signal.SIGTERM: on_stop, signal.SIGINT: on_stop, signal.SIGHUP: lambda *_: orders.roll.set()}
    previous = {s: signal.signal(s, h) for s, h in handlers.items()}
    try:
        yield orders
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _state_option(required: bool):
    return click.option("--state-file", required=required, default=None, type=click.Path(dir_okay=False),
                        help="The file `ovpool serve --state-file` writes (its broker and client keys"
                             + (", its pid)." if required else ")."))


def _seconds(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A finite number of seconds >= 0: NaN or -1 would reach the broker as 0 (drain at once)."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise click.BadParameter(f"a finite number of seconds >= 0, not {value:g}")
    return value


@click.command("drain")
@click.argument("worker", required=False, default="")
@broker_option
@_state_option(required=False)
@click.option("--timeout", "timeout_s", type=float, default=None, metavar="SECONDS", callback=_seconds,
              help="How long accepted requests may run on (setting shutdown_timeout_s, default 30).")
@secret_option
@server_key_option
def drain_command(worker: str, broker: str | None, state_file: str | None, timeout_s: float | None,
                  **curve: Any) -> None:
    """Drain the pool behind BROKER (serve then exits), or only WORKER (a name such as CPU#1, name@host
    or a worker id from `ovpool status`: it gets no new request and stops once idle)."""
    from ovpool.client import Client

    flags: dict[str, Any] = {"broker": broker, **curve}
    if state_file:  # serve's own endpoint and client keys, unless given
        view = _read(state_file)
        flags = {"broker": broker or view.get("endpoint"), **view.get("client_keys", {}),
                 **{k: v for k, v in curve.items() if v}}
    settings = resolve_settings(**flags)
    timeout_s = settings.shutdown_timeout_s if timeout_s is None else timeout_s
    with Client(settings.broker, settings=settings) as client:
        drained = client.drain(worker, timeout_s)["draining"]
    if not worker:
        click.echo(f"draining the pool: new requests are refused (retryable); accepted ones have "
                   f"{drained['pool']['deadline_in_s']:g} s to finish")
    elif not drained["workers"]:
        raise ConfigError(f"no worker named {worker!r} is registered; see `ovpool status`")
    else:
        click.echo(f"draining {', '.join(drained['workers'])}: no new requests; each stops once idle")


@click.command("restart")
@click.option("--rolling", is_flag=True, required=True,
              help="Replace the workers one at a time while the others serve (the only kind).")
@_state_option(required=True)
@click.option("--set", "assignments", multiple=True, metavar="NAME=VALUE",
              help="A worker setting the new processes take (repeatable).")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until every worker runs a new process.")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True, metavar="SECONDS",
              help="With --wait: how long to wait.")
def restart_command(rolling: bool, state_file: str, assignments: tuple[str, ...], wait: bool,
                    timeout_s: float) -> None:
    """Restart the workers of the `ovpool serve` on this host one at a time (SIGHUP): each is drained,
    stopped and started again (new binary, settings, model file) once the one before is ready."""
    parse_assignments(assignments)  # a bad --set fails here, not in serve
    view = _read(state_file)
    if view.get("host") != socket.gethostname() or not view.get("pid"):
        raise ConfigError(f"{state_file} is not the state of an `ovpool serve` on this host")
    before = {w["name"]: w.get("pid") for w in view.get("workers", [])}
    if assignments:
        restart_file(state_file).write_text(json.dumps(list(assignments)))
    try:
        os.kill(view["pid"], signal.SIGHUP)
    except ProcessLookupError:
        raise ConfigError(f"serve (pid {view['pid']}) is not running") from None
    click.echo(f"rolling restart of {len(before)} worker(s) started")
    if wait:
        _wait_replaced(state_file, before, timeout_s)


def _wait_replaced(state_file: str, before: dict[str, int | None], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = _read(state_file)
        workers = {w["name"]: w for w in view.get("workers", [])}
        done = [n for n, w in workers.items() if w["state"] == "ready" and w.get("pid") != before.get(n)]
        if view.get("rolling") is None and len(done) == len(workers):
            click.echo(f"every worker runs a new process ({', '.join(sorted(done))})")
            return
        failing = [f"{n}: {w.get('reason')}" for n, w in workers.items() if w["state"] == "failing"]
        if view.get("rolling") is None and failing and done:
            raise ConfigError(f"the rolling restart stopped: {'; '.join(failing)}")
        time.sleep(0.2)
    raise ConfigError(f"the rolling restart did not finish within {timeout_s:g} s; see `ovpool status`")


def _read(state_file: str) -> dict:
    view = state.read_state(state_file)
    if view is None:
        raise ConfigError(f"no state file {state_file}: is `ovpool serve --state-file {state_file}` running?")
    return view


def register(group: click.Group) -> None:
    group.add_command(drain_command)
    group.add_command(restart_command)
