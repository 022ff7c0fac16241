"""``ovpool serve``: the broker and one supervised worker per device, in one command.

``ovpool probe`` reads the state file serve writes, for Kubernetes exec probes.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from pathlib import Path
from typing import Any

import click

from ovpool import endpoint
from ovpool.cli.common import (
    cache_dir_options,
    check_cache_dir,
    resolve_settings,
    settings_options,
)
from ovpool.cli.drain import serve_signals
from ovpool.errors import BrokerUnavailableError, ConfigError, OvpoolError
from ovpool.serve import state
from ovpool.serve.catalog import ModelEntry, catalog
from ovpool.serve.keys import CURVE_SETTINGS, ChildKeys, child_keys
from ovpool.serve.spec import (
    DEFAULT_BIND,
    DEFAULT_HTTP,
    DEFAULT_MODEL,
    PoolSpec,
    parse_devices,
)
from ovpool.settings import lookup

API_KEY_ENV = "OVPOOL_API_KEY"


def _available_devices() -> list[str]:
    import openvino as ov

    return list(ov.Core().available_devices)


def _spec(devices: str | None, workers: int | None, bind: str, remote: str | None, http: str | None,
          settings: Any, models: tuple[ModelEntry, ...], **fields: Any) -> PoolSpec:
    if remote:
        endpoint.check(remote, "--broker endpoint")
    else:
        endpoint.check(bind, "--bind address")
        if bind.startswith("tcp://") and bind.rsplit(":", 1)[1] in ("0", "*"):
            _any_port("--bind", bind, "tcp://127.0.0.1:5555")
    auto = devices is not None and devices.strip().lower() == "auto"
    listed = parse_devices(devices, workers, _available_devices() if auto else None)
    if http:
        from ovpool.api.server import parse_bind

        if parse_bind(http)[1] == 0:  # a bad --http fails now, not in the child
            _any_port("--http", http, "127.0.0.1:8000")
    if len(models) > 1 and fields.get("served_names"):
        raise click.UsageError("--served-name names the one model of a pool; with several, give "
                               "names as --model NAME=PATH or served_names in a --models file")
    return PoolSpec(models=models, max_loaded=settings.max_loaded or None, keep_alive_s=settings.keep_alive_s,
                    max_loaded_mb=settings.max_loaded_mb or None, spare_worker=settings.spare_worker,
                    devices=tuple(listed), bind=None if remote else bind, broker=remote or "",
                    cache_dir=settings.cache_dir,
                    cache_only=settings.cache_only, metrics_port=settings.metrics_port, http=http, **fields)


def _any_port(option: str, value: str, example: str) -> None:
    """Port 0 or * binds any free port, which serve's workers, its probes and its users cannot know."""
    raise click.BadParameter(f"{value!r} asks for any free port, which no worker or client could find;"
                             f" give a fixed one, e.g. {example}", param_hint=option)


def _http_bind(http: str | None, no_http: bool, remote: str | None) -> str | None:
    """The HTTP API's HOST:PORT: on by default with a local broker; joining a remote broker (a
    worker host) runs one only when --http asks for it."""
    if no_http:
        if http:
            raise click.UsageError("pass --http or --no-http, not both")
        return None
    return http or (None if remote else DEFAULT_HTTP)


def _status_fn(endpoint: str, settings: Any):
    from ovpool.client import Client

    client = Client(endpoint, settings=settings)

    def status() -> dict | None:
        try:
            return client.status(timeout=1.0)
        except BrokerUnavailableError:
            return None

    return client, status


def _publisher(state_file: str | None, client: Any, client_keys: dict[str, str]):
    """Serve's view goes to the state file (probes; with the paths of the pool's client keys, for
    this user's own tools: the file is 0600) and to the broker (`ovpool status`)."""
    pid = os.getpid()

    def publish(view: dict) -> None:
        if state_file:
            state.write_state(state_file, {**view, "client_keys": client_keys})
        # Flat entries: the broker keeps only maps of text and numbers (it has each load from READY).
        client.report_supervised(view["host"], pid, [{k: v for k, v in w.items() if k != "load"}
                                                     for w in view["workers"]])

    return publish


@click.command("serve")
@click.option("--model", "models", multiple=True, metavar="[NAME=]MODEL",
              help=f"GGUF path or alias, repeatable: several load on demand (default {DEFAULT_MODEL}; "
                   "env OVPOOL_MODEL). NAME=PATH names it; else the alias or the file's stem.")
@click.option("--models-dir", default=None, type=click.Path(file_okay=False), metavar="DIR",
              help="Serve every .gguf file in DIR too, each by its file's stem, loaded on demand.")
@click.option("--models", "models_file", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="A TOML models file: per-model path, served names, slots, devices, keep-alive, "
                   "pinned (docs/operations.md, Many models).")
@click.option("--max-loaded", type=int, default=None, metavar="N",
              help="Several models: at most N loaded at once; the least recently used idle one "
                   "unloads first (setting max_loaded; 0: no limit).")
@click.option("--max-loaded-mb", type=float, default=None, metavar="MIB",
              help="Several models: at most MIB of loaded models per device (their workers' PSS); "
                   "the least recently used idle one unloads first (setting max_loaded_mb; 0: none).")
@click.option("--keep-alive", type=float, default=None, metavar="SECONDS",
              help="Several models: unload one idle this long (setting keep_alive_s, default 300; "
                   "-1: never).")
@click.option("--devices", default=None, metavar="LIST",
              help="One worker per device: CPU,GPU.0,GPU.1 (a device may repeat), or auto (every GPU).")
@click.option("--workers", type=int, default=None, help="N workers on CPU (instead of --devices).")
@click.option("--bind", default=DEFAULT_BIND, show_default=True, help="Endpoint the local broker binds.")
@click.option("--broker", "remote", default=None, metavar="URL",
              help="Join this broker instead of starting one (workers on another host).")
@cache_dir_options
@click.option("--cache-only", is_flag=True, default=None, help="Workers import from the cache or fail.")
@click.option("--slots", type=int, default=None, help="Concurrent sequences per worker.")
@click.option("--metrics-port", type=int, default=None,
              help="The broker's Prometheus /metrics port (setting metrics_port; 0: off).")
@click.option("--state-file", default=None, type=click.Path(dir_okay=False),
              help="Write serve's view of its workers here (read by `ovpool probe`).")
@click.option("--backend", type=click.Choice(["engine", "null"]), default="engine", show_default=True,
              help="null: workers send fake tokens, to try the pool without a model.")
@click.option("--token-delay", type=float, default=0.0, help="Seconds per step of the null backend.")
@click.option("--served-name", "served_names", multiple=True, metavar="NAME",
              help="A name clients use for the model (repeatable); default: the alias or path and the "
                   "file's stem.")
@click.option("--http", default=None, metavar="HOST:PORT",
              help=f"The OpenAI-compatible HTTP API (default {DEFAULT_HTTP} with a local broker).")
@click.option("--no-http", is_flag=True, help="Do not start the HTTP API.")
@click.option("--api-key-file", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help=f"Bearer keys the HTTP API requires, one a line (or comma-separated); also env "
                   f"{API_KEY_ENV}. Never on a command line, where `ps` shows it.")
@click.option("--api-key", "api_key_flag", multiple=True, hidden=True, expose_value=True)
@click.option("--open", "open_pool", is_flag=True,
              help="No CURVE: any process that can reach the broker may submit and serve. By default "
                   "only serve's own processes (and the keys below) can join.")
@click.option("--curve-secret-key", default=None, type=click.Path(dir_okay=False),
              help="CURVE key pair (.key_secret): the local broker's (peers on other hosts hold its "
                   "public key), or with --broker this host's.")
@click.option("--curve-allowed-keys", default=None, type=click.Path(file_okay=False),
              help="Local broker: directory of the public keys of clients on other hosts.")
@click.option("--curve-worker-keys", default=None, type=click.Path(file_okay=False),
              help="Local broker: directory of the public keys of workers on other hosts.")
@click.option("--curve-server-key", default=None, type=click.Path(dir_okay=False),
              help="With --broker: the broker's CURVE public key (.key).")
@click.option("--keep-up-on-worker-failure", "keep_up", is_flag=True,
              envvar="OVPOOL_KEEP_UP_ON_WORKER_FAILURE",
              help="Keep serving (broker, HTTP API) when every worker has failed for good; by default "
                   "serve then exits with status 2.")
@settings_options
def serve_command(models: tuple[str, ...], models_dir: str | None, models_file: str | None,
                  max_loaded: int | None, max_loaded_mb: float | None, keep_alive: float | None,
                  devices: str | None, workers: int | None, bind: str, remote: str | None,
                  cache_dir: str | None, cache_only: bool | None, metrics_port: int | None,
                  state_file: str | None, http: str | None, no_http: bool, api_key_file: str | None,
                  api_key_flag: tuple[str, ...], keep_up: bool, open_pool: bool,
                  served_names: tuple[str, ...], assignments: tuple[str, ...], **fields: Any) -> None:
    """Run a broker, one worker per device and the HTTP API on this host; Ctrl-C or SIGTERM stops
    them all."""
    from ovpool.serve import preflight

    if api_key_flag:
        raise click.UsageError(f"--api-key would show the key to every local user (ps); put it in a "
                               f"file for --api-key-file (mode 0600) or in {API_KEY_ENV}")
    curve = {k: fields.pop(k) for k in CURVE_SETTINGS}
    settings = resolve_settings(assignments, cache_dir=cache_dir, cache_only=cache_only,
                                metrics_port=metrics_port, max_loaded=max_loaded, keep_alive_s=keep_alive,
                                max_loaded_mb=max_loaded_mb,
                                **curve)
    if fields.get("backend") != "null":
        check_cache_dir(settings)
    # OVPOOL_MODEL names one model, whole (a path may hold spaces), where no flag names any.
    default = (os.environ.get("OVPOOL_MODEL") or DEFAULT_MODEL,)
    entries = _with_chat(catalog(models if models or models_dir or models_file else default, models_dir,
                                 models_file))
    spec = _spec(devices, workers, bind, remote, _http_bind(http, no_http, remote), settings, entries,
                 assignments=_without_curve(assignments), served_names=served_names, **fields)
    api_keys = _api_keys(api_key_file)
    bad = preflight.check(spec)  # before any child: one line and status 2 for what no restart fixes
    with child_keys(settings, local_broker=spec.bind is not None, open_pool=open_pool) as keys:
        _echo_start(spec, remote, keys)
        _run(spec, settings, keys, state_file, api_keys, keep_up, bad)


def _with_chat(entries: tuple[ModelEntry, ...]) -> tuple[ModelEntry, ...]:
    """Several models: whether each has a chat template, from its GGUF header (30-90 ms), so
    /v1/models says so before it loads; a file that cannot be read stays unknown (its load fails)."""
    if len(entries) < 2:
        return entries
    from ovpool.models import resolve_model_path
    from ovpool.worker.gguf.file import read_header
    from ovpool.worker.text.chat import TEMPLATE_KEY

    def chat(entry: ModelEntry) -> bool | None:
        try:
            return TEMPLATE_KEY in read_header(resolve_model_path(entry.source)).metadata
        except OvpoolError:
            return None

    return tuple(dataclasses.replace(e, chat=chat(e)) for e in entries)


def _run(spec: PoolSpec, settings: Any, keys: ChildKeys, state_file: str | None, api_keys: list[str],
         keep_up: bool, bad: dict[str, str]) -> None:
    from ovpool.serve.pool import Pool

    base = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    http_env = {**base, **keys.env("client"), API_KEY_ENV: ",".join(api_keys)}
    client, status = _status_fn(spec.endpoint, settings.replace(**keys.client))
    publish = _publisher(state_file, client, keys.client)
    drain = getattr(client, "drain", None)
    with client, serve_signals(state_file) as orders, \
            Pool(spec, status, publish, env={**base, **keys.env("worker")}, http_env=http_env,
                 broker_env={**base, **keys.env("broker")}, keep_up=keep_up,
                 drain=(lambda name: drain(worker=name, timeout=1.0)) if drain else None,
                 broker_drain=lambda worker, timeout_s: client.drain(worker, timeout_s, timeout=2.0),
                 shutdown_timeout_s=settings.shutdown_timeout_s) as pool:
        for model, reason in bad.items():  # a model file preflight found bad: failed from the start
            pool.loads.residency.failed(model, reason)
        pool.run(orders)


def _echo_start(spec: PoolSpec, remote: str | None, keys: ChildKeys) -> None:
    what = spec.model if not spec.on_demand else (
        f"{len(spec.models)} models on demand ({', '.join(m.name for m in spec.models)}; at most "
        f"{spec.max_loaded or 'all'} loaded"
        + (f", {spec.max_loaded_mb:g} MiB a device" if spec.max_loaded_mb else "") + ")")
    click.echo(f"ovpool serve: {what} on {len(spec.devices)} worker(s) ({', '.join(spec.devices)}), "
               f"broker {spec.endpoint}" + (" (remote)" if remote else "") + f" ({keys.mode})"
               + f", cache {spec.cache_dir or 'off'}"
               + (f", HTTP API http://{spec.http}/v1" if spec.http else ""))
    sys.stdout.flush()


def _without_curve(assignments: tuple[str, ...]) -> tuple[str, ...]:
    """--set items for the workers' command lines: CURVE keys go through child_keys instead."""
    return tuple(a for a in assignments if lookup(a.partition("=")[0]).name not in CURVE_SETTINGS)


def _api_keys(path: str | None) -> list[str]:
    """The HTTP API's keys: from --api-key-file (one a line) and the environment variable."""
    from ovpool.api.keys import parse

    keys = parse([os.environ.get(API_KEY_ENV, "")])
    if path:
        try:
            in_file = parse(Path(path).read_text(encoding="utf-8").splitlines())
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or exc
            raise click.BadParameter(f"cannot read {path}: {why}", param_hint="--api-key-file") from None
        if not in_file:  # a key meant, none there: the API must not come up open
            raise click.BadParameter(f"{path} holds no key (one a line): put the keys in it, or leave"
                                     " --api-key-file out to serve without keys", param_hint="--api-key-file")
        keys += in_file
    return keys


@click.command("probe")
@click.option("--state-file", required=True, type=click.Path(dir_okay=False),
              help="The file `ovpool serve --state-file` writes.")
@click.option("--ready", "need_ready", is_flag=True, help="Also require at least one ready worker.")
def probe_command(state_file: str, need_ready: bool) -> None:
    """Exit 0 if `ovpool serve` is alive (and with --ready, serving); else 1 (Kubernetes exec probe)."""
    try:
        ok, why = state.check(state.read_state(state_file), need_ready=need_ready)
    except ConfigError as exc:  # not healthy, and why: the probe's answer, exit 1 all the same
        ok, why = False, str(exc)
    click.echo(f"{socket.gethostname()}: {why}")
    sys.exit(0 if ok else 1)


def register(group: click.Group) -> None:
    group.add_command(serve_command)
    group.add_command(probe_command)
