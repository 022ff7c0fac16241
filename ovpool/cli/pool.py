"""``ovpool broker``, ``ovpool worker``, ``ovpool complete``, ``ovpool keys``."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import click

from ovpool import endpoint, errors
from ovpool.cli.common import (
    broker_option,
    cache_dir_options,
    check_cache_dir,
    emit_json,
    prompt_options,
    resolve_settings,
    response_format_options,
    sampling_options,
    secret_option,
    server_key_option,
    settings_options,
    stop_on_signals,
    tool_options,
)
from ovpool.config import BrokerConfig, GraphConfig, WorkerConfig


@click.command("broker")
@click.option("--bind", default="tcp://127.0.0.1:5555", show_default=True, help="Endpoint to bind.")
@click.option("--queue-limit", type=int, default=None, help="Requests queued per model before QueueFull.")
@click.option("--metrics-port", type=int, default=None,
              help="Serve Prometheus /metrics on this port (setting metrics_port; 0: off).")
@secret_option
@click.option("--curve-allowed-keys", default=None, type=click.Path(file_okay=False),
              help="Directory of client public keys (the HTTP API's too) allowed to submit"
                   " (enables CURVE with --curve-secret-key).")
@click.option("--curve-worker-keys", default=None, type=click.Path(file_okay=False),
              help="Directory of worker public keys allowed to register (needed with CURVE).")
@click.option("--role", type=click.Choice(["primary", "backup"]), default=None,
              help="One of a standby pair (with --peer and --peer-bind): which one this is.")
@click.option("--peer", default=None, help="Standby pair: the peer's state endpoint (its --peer-bind).")
@click.option("--peer-bind", default=None, help="Standby pair: where this broker publishes its state.")
@settings_options
def broker_command(bind: str, queue_limit: int | None, metrics_port: int | None, curve_secret_key: str | None,
                   curve_allowed_keys: str | None, curve_worker_keys: str | None, role: str | None,
                   peer: str | None, peer_bind: str | None, assignments: tuple[str, ...]) -> None:
    """Run the broker: queues, routing, heartbeats and re-dispatch (stop with SIGTERM or Ctrl-C).
    With --role, --peer and --peer-bind, one of a standby pair (docs/operations.md)."""
    from ovpool.broker.server import Broker
    from ovpool.broker.standby import Standby

    pair = (role, peer, peer_bind)
    if any(pair) and not all(pair):
        raise click.UsageError("a standby broker needs all of --role, --peer and --peer-bind")
    standby = Standby(role, peer_bind, peer) if all(pair) else None

    settings = resolve_settings(assignments, queue_limit=queue_limit, metrics_port=metrics_port,
                                curve_secret_key=curve_secret_key,
                                curve_allowed_keys=curve_allowed_keys,
                                curve_worker_keys=curve_worker_keys)
    with stop_on_signals() as stop, Broker(bind, BrokerConfig.of(settings), standby) as broker:
        broker.serve(stop)


@click.command("worker")
@broker_option
@click.option("--model", required=True,
              help="GGUF path or alias (e.g. smollm2); any name with --backend null.")
@click.option("--backend", type=click.Choice(["engine", "null"]), default="engine", show_default=True,
              help="null: fake deterministic tokens, for testing the pool without a model.")
@click.option("--name", default=None, help="Worker name shown by `ovpool status`.")
@click.option("--device", default=None, help="OpenVINO device (CPU, GPU, GPU.1, ...).")
@click.option("--slots", type=int, default=None, help="Concurrent sequences (setting slots).")
@cache_dir_options
@click.option("--cache-only", is_flag=True, default=None, help="Import from the cache or fail.")
@click.option("--token-delay", type=float, default=0.0, help="Seconds per step of the null backend.")
@click.option("--served-name", "served_names", multiple=True, metavar="NAME",
              help="A name clients use for the model (repeatable; the first is the one `ovpool status` "
                   "shows); default: the alias or path given and the file's stem.")
@secret_option
@server_key_option
@settings_options
def worker_command(broker: str | None, model: str, backend: str, name: str | None, token_delay: float,
                   served_names: tuple[str, ...], assignments: tuple[str, ...], **flags: Any) -> None:
    """Run a worker process serving one model on one device (exit status 3: an error a restart
    cannot change, such as a model it cannot load; `ovpool serve` does not retry it)."""
    settings = resolve_settings(assignments, broker=broker, **flags)
    endpoint.check(settings.broker)  # now, not after the model has loaded
    # serve's spare process (serve/spare.py) may have read the model's header and tokenizer.
    read_ahead = click.get_current_context().find_root().obj
    opened = read_ahead.take(model) if read_ahead is not None else None
    try:
        _run_worker(settings, model, backend, name, token_delay, served_names, opened)
    except errors.OvpoolError as exc:
        if not errors.permanent(exc):
            raise
        click.echo(f"error: {exc}", err=True)
        sys.exit(errors.EXIT_PERMANENT)


def _run_worker(settings: Any, model: str, backend: str, name: str | None, token_delay: float,
                served_names: tuple[str, ...], opened: Any = None) -> None:
    if backend == "engine":
        check_cache_dir(settings)
    early = None
    if backend == "engine":
        from ovpool.cache import prefetch
        from ovpool.worker.graph.first_pass import for_warm_up

        # A likely hit imports, and runs its first pass, while the rest loads.
        early = prefetch.start(model, settings.device, GraphConfig.of(settings), settings.cache_dir,
                               first_pass=for_warm_up(settings.warm_up))
    from ovpool.worker.process import Worker

    names = list(served_names)
    with _backend(backend, model, settings, token_delay, early, names, name, opened) as (be, load_report), \
            stop_on_signals() as stop, \
            Worker(settings.broker, be, config=WorkerConfig.of(settings), device=settings.device, name=name,
                   load_report=load_report) as worker:
        worker.run(stop)


@contextlib.contextmanager
def _backend(kind: str, model: str, settings: Any, token_delay: float, early: Any = None,
             names: list[str] | None = None, name: str | None = None,
             opened: Any = None) -> Iterator[tuple[Any, dict]]:
    """(backend, the Engine's load report: {} for the null backend); ``early``: the Engine's
    import begun by prefetch.start; ``names``: --served-name; ``name``: --name; ``opened``:
    the model's header and tokenizer read ahead (ovpool.worker.opened), or None. A model that
    cannot load for good is reported to the broker (LOAD_FAILED) before the error is raised."""
    if kind == "null":
        from ovpool.worker.null_backend import NullBackend

        yield NullBackend(names or [model], settings.slots, token_delay, settings.max_prompt_tokens), {}
        return
    from ovpool.worker.backend import EngineBackend
    from ovpool.worker.engine import Engine
    from ovpool.worker.process import report_load_failure

    try:
        engine = Engine(model, device=settings.device, settings=settings, cache_only=settings.cache_only,
                        early=early, opened=opened)
    except errors.OvpoolError as exc:
        if errors.permanent(exc):
            config = WorkerConfig.of(settings)
            report_load_failure(config, [*(names or []), model], config.device, name, exc)
        raise
    with engine:
        yield EngineBackend(engine, settings.slots, aliases=[model], names=names), engine.load_report


@click.command("complete")
@prompt_options
@broker_option
@click.option("--model", default="", help="Model name (default: the only one served).")
@sampling_options
@click.option("--timeout", type=float, default=None, help="Seconds before the request fails.")
@click.option("--stream", is_flag=True, help="Print tokens as they arrive.")
@click.option("--json", "as_json", is_flag=True, help="Print the Completion as JSON (for programs).")
@response_format_options
@tool_options
@secret_option
@server_key_option
def complete_command(prompt: str | list, broker: str | None, model: str, sampling: dict,
                     timeout: float | None, stream: bool, as_json: bool, response_format: dict | None,
                     tools: dict, **curve: Any) -> None:
    """Complete PROMPT through the broker (PROMPT '-' reads stdin, '@FILE' reads FILE). With
    --tools the prompt is a chat message and the calls the model makes print as JSON."""
    from ovpool.client import Client

    sampling = {**sampling, "response_format": response_format, **tools}
    if tools and isinstance(prompt, str):  # the model's template renders the tools
        prompt = [{"role": "user", "content": prompt}]
    with Client(broker, model=model, timeout=timeout, settings=resolve_settings(**curve)) as client:
        if stream and not as_json:
            streamed = client.stream(prompt, **sampling)
            for delta in streamed:
                click.echo(delta.text, nl=False)
                sys.stdout.flush()
            click.echo()
            completion = streamed.completion
        else:
            completion = (client.chat if isinstance(prompt, list) else client.complete)(prompt, **sampling)
    if as_json:
        emit_json(completion.to_dict())
        return
    if not stream and (completion.text or not completion.tool_calls):
        click.echo(completion.text)
    if completion.tool_calls:
        emit_json([{"id": c.id, "name": c.name, "arguments": c.parsed_arguments()}
                   for c in completion.tool_calls])
    if completion.note:
        click.echo(f"note: {completion.note}", err=True)


@click.group("keys")
def keys_group() -> None:
    """CURVE keys for encrypting and authenticating the pool's connections."""


@keys_group.command("generate")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--name", default="broker", show_default=True, help="File name stem of the key pair.")
def keys_generate(directory: str, name: str) -> None:
    """Write NAME.key (public) and NAME.key_secret (private). The broker's directory of the public
    key is the peer's role: curve_allowed_keys for a client (the HTTP API too), curve_worker_keys
    for a worker."""
    from ovpool.auth import generate

    public, secret = generate(directory, name)
    click.echo(f"public key: {public}\nsecret key: {secret} (keep it private)")


def register(group: click.Group) -> None:
    for command in (broker_command, worker_command, complete_command, keys_group):
        group.add_command(command)
