"""``ovpool status``: the broker's status for a person (tables fitted to the terminal) or as JSON."""

from __future__ import annotations

import textwrap
from typing import Any

import click

from ovpool import endpoint, errors
from ovpool.cli.common import broker_option, emit_json, resolve_settings, secret_option, server_key_option


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


def register(group: click.Group) -> None:
    group.add_command(status_command)
