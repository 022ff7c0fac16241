"""``ovpool broker``, ``ovpool worker``, ``ovpool complete``, ``ovpool status``, ``ovpool keys``."""

from __future__ import annotations

import contextlib
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import click

from ovpool import endpoint, errors
from ovpool.cli.common import (
    cache_dir_options,
    check_cache_dir,
    emit_json,
    prompt_options,
    resolve_settings,
    response_format_options,
    sampling_options,
    settings_options,
    stop_on_signals,
    tool_options,
)
from ovpool.config import BrokerConfig, GraphConfig, WorkerConfig

broker_option = click.option("--broker", default=None, envvar="OVPOOL_BROKER",
                              help="Broker endpoint (env OVPOOL_BROKER; default tcp://127.0.0.1:5555).")
secret_option = click.option("--curve-secret-key", default=None, type=click.Path(dir_okay=False),
                              help="This process's CURVE key pair (.key_secret from `ovpool keys generate`).")
server_key_option = click.option("--curve-server-key", default=None, type=click.Path(dir_okay=False),
                                  help="The broker's CURVE public key (.key).")


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


@click.command("status")
@broker_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw status as JSON (for programs).")
@secret_option
@server_key_option
def status_command(broker: str | None, as_json: bool, **curve: Any) -> None:
    """Workers, slots, queue depths and counters of the broker (--broker A,B: of a standby pair's
    active one, named first)."""
    from ovpool.client import Client

    settings = resolve_settings(**curve)
    if len(endpoint.split(settings.broker if broker is None else broker)) > 1:
        status = _pair_status(endpoint.split(broker or settings.broker), settings)
    else:
        with Client(broker, settings=settings) as client:
            status = client.status()
    if as_json:
        emit_json(status)
        return
    print_status(status)


def _pair_status(endpoints: list[str], settings: Any) -> dict:
    """The active broker's status, with ``pair``: each endpoint's state in the standby pair."""
    from ovpool.client import Client

    pair, active = [], None
    for ep in endpoints:
        try:
            with Client(ep, settings=settings) as client:
                status = client.status(timeout=5.0)
        except errors.BrokerUnavailableError as exc:
            pair.append({"endpoint": ep, "state": "unreachable", "role": None, "error": str(exc)})
            continue
        standby = status.get("standby") or {"state": "active", "role": None}  # a lone broker serves
        pair.append({"endpoint": ep, "state": standby["state"], "role": standby["role"]})
        if standby["state"] == "active" and active is None:
            active = status
    names = ", ".join(f"{p['endpoint']} {p['state']}" for p in pair)
    if active is None:
        raise errors.BrokerUnavailableError(
            f"no broker of the pair is active ({names}); a passive one whose peer is silent takes"
            " over at a client's first request (STATUS is no vote)")
    return {**active, "pair": pair}


def print_status(status: dict) -> None:
    """The broker's status for a person: one summary line, a table of workers (fitted to the
    terminal), whether each batches, the workers that are not ready or failed and why, the counters."""
    from ovpool.cli.tables import print_table

    queues = ", ".join(f"{model} {depth}" for model, depth in status["queues"].items()) or "none"
    for p in status.get("pair", []):
        role = f" ({p['role']})" if p["role"] else ""
        click.echo(f"{'active broker' if p['state'] == 'active' else 'standby'}: {p['endpoint']}{role}"
                   f"{'' if p['state'] == 'active' else ' ' + p['state']}")
    click.echo(f"up {status['uptime_s']:.0f} s, {status['in_flight']} in flight, "
               f"{len(status['workers'])} worker(s); queued: {queues}")
    if status["workers"]:
        print_table("workers", ("worker", "device", "slots", "model load", "prefix cache", "models"),
                    [(w["id"], w["device"], f"{w['active']}/{w['slots']} busy",
                      _load_text(w.get("load") or {}), _prefix_text(w.get("prefix_cache") or {}),
                      ", ".join(w["models"])) for w in status["workers"]],
                    whole=("worker", "prefix cache"))
    for w in status["workers"]:
        if batching := (w.get("load") or {}).get("batching"):
            click.secho(_wrapped(f"  {w['id']}: continuous batching {batching}"),
                        fg="yellow" if batching.startswith("off") else None)
        if graph := (w.get("load") or {}).get("graph"):  # every auto as the worker resolved it
            click.echo(_wrapped(f"  {w['id']}: graph " + " ".join(f"{k}={v}" for k, v in graph.items())))
    _print_models(status)
    for s in status.get("supervised", []):
        if s.get("state") not in ("ready", "stopped", "unloaded"):  # not registered (yet): say why
            line = f"  {s.get('host')} {s.get('name')}: {s.get('state')}: {s.get('reason') or ''}"
            click.secho(_wrapped(line), fg="red" if s.get("state") == "failing" else "yellow")
    for f in status.get("failed", []):  # LOAD_FAILED: workers that could not load their model
        click.secho(_wrapped(f"  {f['id']}: cannot load {', '.join(f['models'])}: {f['message']}"), fg="red")
    click.echo(_wrapped("counters: " + "  ".join(f"{k}={v}" for k, v in status["counters"].items())))


def _print_models(status: dict) -> None:
    """The models `ovpool serve` loads on demand (its entries with ``residency``), one row each."""
    from ovpool.cli.tables import print_table

    rows = {e["model"]: e for e in status.get("supervised", []) if isinstance(e.get("residency"), str)}
    if rows:
        columns = ("model", "state", "loads", "unloads", "waiting", "memory", "keep-alive", "why")
        print_table("models", columns,
                    [(m, e["residency"] + (" (pinned)" if e.get("pinned") else ""), str(e.get("loads", 0)),
                      str(e.get("unloads", 0)), f"{e.get('waiting_s', 0):.1f}s",
                      f"{e.get('memory_mib', 0):,.0f} MiB", _keep_alive(e),
                      e.get("residency_reason") or "") for m, e in sorted(rows.items())], whole=("model",))


def _keep_alive(entry: dict) -> str:
    """A model's keep-alive for a person: "300s", "never", "0s (request)" (its latest request's)."""
    keep = entry.get("keep_alive_s", 0)
    text = "never" if keep < 0 else f"{keep:g}s"
    return text + (" (request)" if entry.get("keep_alive_from") == "request" else "")


def _wrapped(text: str) -> str:
    """``text`` wrapped at the terminal's width (rich's detection), its words whole."""
    from rich.console import Console

    return textwrap.fill(text, Console().width, subsequent_indent="    ", break_long_words=False,
                         break_on_hyphens=False)


def _prefix_text(prefix: dict) -> str:
    """Prompt tokens a worker took from its prefix cache, e.g. "cached 900/1,200 (75%)"."""
    total, cached = prefix.get("prompt_tokens", 0), prefix.get("cached_prompt_tokens", 0)
    if not total:
        return "cached -"
    return f"cached {cached:,}/{total:,} ({cached / total:.0%})"


def _load_text(load: dict) -> str:
    """How a worker got its model, e.g. "hit 0.4s" (cache import) or "wrote 12.0s"."""
    if not load.get("outcome"):
        return "-"
    return f"{load['outcome']} {load.get('seconds', 0):.1f}s"


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
    for command in (broker_command, worker_command, complete_command, status_command, keys_group):
        group.add_command(command)
