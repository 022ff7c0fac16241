"""``ovpool cache``: inspect and maintain a compiled-model cache directory."""

from __future__ import annotations

import datetime
import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from ovpool.cache import maintenance
from ovpool.cache.store import CacheStore
from ovpool.cli.common import check_cache_dir, emit_json, resolve_settings, settings_options
from ovpool.errors import ConfigError

# What `cache gc` removes, by the key of its report.
_GC_KINDS = {"temp": "temp file(s) of dead writers", "manifests": "unreadable manifest(s)",
             "blobs": "blob(s) no entry uses", "stale": "entr(y/ies) that can never match again",
             "kv": "KV block(s) beyond kv_tier_mb",
             "entries": "least recently used entr(y/ies) and KV block(s) beyond the budget",
             "hints": "stale start-up hint(s)"}
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def cache_options(func: Callable) -> Callable:
    """``--cache-dir`` (default: the cache_dir setting, as every command uses it) and ``--json``."""

    @click.option("--cache-dir", default=None, metavar="DIR",
                  help="Cache directory (default: setting cache_dir, env OVPOOL_CACHE_DIR, else "
                       "$XDG_CACHE_HOME/ovpool or ~/.cache/ovpool).")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @functools.wraps(func)
    def wrapper(*args: Any, cache_dir: str | None, **kwargs: Any) -> Any:
        settings = check_cache_dir(resolve_settings(cache_dir=cache_dir),
                                   fix="pass --cache-dir with the cache's directory")
        if not settings.cache_dir:
            raise ConfigError("no cache directory: cache_dir is empty (caching is off"
                              + (", from OVPOOL_CACHE_DIR" if settings.source("cache_dir") == "env" else "")
                              + "); pass --cache-dir DIR")
        return func(*args, store=CacheStore(settings.cache_dir), **kwargs)

    return wrapper


def _when(ts: float | None) -> str:
    return "never" if ts is None else datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _current() -> maintenance.Current:
    """What this ovpool writes (imports the graph builder and OpenVINO: only where entries exist)."""
    from ovpool.cache.fingerprint import openvino_version
    from ovpool.worker.graph.builder import BUILDER_HASH

    return maintenance.Current(BUILDER_HASH, openvino_version())


def _budgets() -> tuple[int, int]:
    """(cache_max_mb, kv_tier_mb) in bytes, from the settings."""
    settings = resolve_settings()
    return settings.cache_max_mb << 20, settings.kv_tier_mb << 20


def _usage_line(store: CacheStore) -> str:
    found, (whole, kv) = maintenance.sizes(store), _budgets()
    return (f"in all {_size(found['total'])} of {_size(whole)} (cache_max_mb)\n"
            f"  compiled models {_size(found['compiled'])}, IR {_size(found['ir'])}, "
            f"other {_size(found['other'])}\n"
            f"  KV tier {_size(found['kv'])} in {found['kv_blocks']} blocks, of {_size(kv)} (kv_tier_mb)")


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _parse_bytes(text: str | None) -> int | None:
    if text is None:
        return None
    number, unit = text.strip().upper().rstrip("IB"), ""
    if number and number[-1] in _UNITS:
        number, unit = number[:-1], number[-1]
    try:
        return int(float(number) * _UNITS[unit])
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: expected a size such as 500M or 20G") from exc


@click.group("cache")
def cache_group() -> None:
    """Inspect and maintain the compiled-model cache (see docs/cache.md)."""


@cache_group.command("ls")
@cache_options
def ls_command(store: CacheStore, as_json: bool) -> None:
    """List entries: model file, architecture, form, device, settings, ports, size, created, hits,
    last hit."""
    found = list(maintenance.entries(store))
    current = _current() if found else None
    rows = [maintenance.describe(store, m, e, current) for m, e in found]
    bad = maintenance.unreadable(store)
    for r in bad:  # stderr, so --json stays one document
        click.echo(f"BAD manifest {r['family']}: {r['problem']} (`ovpool cache gc` removes it)", err=True)
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo(f"no entries in {store.root}" + (" (nothing cached yet)" if not bad else ""))
        click.echo(_usage_line(store))
        return
    from ovpool.cli.tables import print_table

    print_table(f"model cache {store.root}",
                ("entry", "model", "arch", "form", "device", "settings", "ports", "size", "created",
                 "hits", "last hit", "stale"),
                [(r["entry"], "\n".join(r["models"]), r["architecture"],
                  r["form"], r["device"], " ".join(f"{k}={v}" for k, v in r["settings"].items()),
                  f"{len(r['ports'])} ports", _size(r["size"]), _when(r["created"]), str(r["hits"]),
                  _when(r["last_hit"]), "STALE" if r["stale"] else "") for r in rows],
                whole=("entry",))  # show and rm need it whole
    for r in rows:
        if r["stale"]:
            click.echo(f"STALE {r['entry']}: {r['stale']} (`ovpool cache gc` removes it)")
    click.echo(_usage_line(store))


@cache_group.command("show")
@click.argument("entry")
@cache_options
def show_command(entry: str, store: CacheStore, as_json: bool) -> None:
    """Everything about one entry (a unique prefix of its id is enough)."""
    info = maintenance.show(store, entry)
    if as_json:
        emit_json(info)
        return
    for key in ("entry", "family", "models", "blob", "size", "checksum", "openvino", "device"):
        click.echo(f"{key}: {info[key]}")
    click.echo(f"created: {_when(info['created'])}\nhits: {info['hits']}\n"
               f"last hit: {_when(info['last_hit'])}\nports:")
    for p in info["ports"]:
        click.echo(f"  {p['direction']:3} {p['name']} {p['element_type']}{p['partial_shape']}")
    click.echo("fingerprint:")
    for k, v in info["fingerprint"].items():
        click.echo(f"  {k}: {v}")


@cache_group.command("verify")
@cache_options
def verify_command(store: CacheStore, as_json: bool) -> None:
    """Check every manifest, every blob's and every KV block's full checksum; exit status 1 if
    any is bad."""
    results = maintenance.verify(store)
    if as_json:
        emit_json(results)
    else:
        blocks = [r for r in results if "block" in r]  # KV blocks: by the thousand, so bad ones only
        for r in results:
            if not ("block" in r and r["ok"]):
                click.echo(f"{'ok ' if r['ok'] else 'BAD'} {r.get('block') or r['entry'] or r['family']}"
                           + (f": {r['problem']}" if r["problem"] else ""))
        entries = [r for r in results if "block" not in r]
        click.echo(f"{sum(r['ok'] for r in entries)} of {len(entries)} ok, "
                   f"{sum(r['ok'] for r in blocks)} of {len(blocks)} KV blocks ok")
    if not all(r["ok"] for r in results):
        sys.exit(1)


@cache_group.command("gc")
@click.option("--max-bytes", default=None, help="Then evict least recently used entries and KV blocks "
              "while the directory is larger than this (e.g. 20G; default: setting cache_max_mb).")
@cache_options
def gc_command(max_bytes: str | None, store: CacheStore, as_json: bool) -> None:
    """Remove temp files of dead writers, unreadable manifests, unreferenced blobs, entries that
    can never match again (model file gone or changed, another graph builder or OpenVINO), KV
    blocks beyond kv_tier_mb, least recently used entries and blocks beyond the budget, hints
    whose blob is gone. Never an entry a live process maps."""
    whole, kv = _budgets()
    current = _current() if store.families() else None
    report = maintenance.gc(store, _parse_bytes(max_bytes) or whole, current, kv_bytes=kv)
    if as_json:
        emit_json(report)
        return
    freed = report.pop("freed_bytes")
    removed = {kind: names for kind, names in report.items() if names}
    for kind, names in removed.items():
        click.echo(f"removed {len(names)} {_GC_KINDS.get(kind, kind)}" + "".join(f"\n  {n}" for n in names))
    click.echo(f"freed {_size(freed)} in {store.root}" if removed else f"nothing to remove in {store.root}")


@cache_group.command("rm")
@click.argument("entries", nargs=-1, required=True)
@cache_options
def rm_command(entries: tuple[str, ...], store: CacheStore, as_json: bool) -> None:
    """Remove entries (unique id prefixes) and their blobs."""
    removed = [maintenance.remove(store, e) for e in entries]
    emit_json(removed) if as_json else click.echo("\n".join(f"removed {e}" for e in removed))


@cache_group.command("explain")
@click.option("--model", required=True, help="GGUF path or alias.")
@click.option("--device", default=None, help="OpenVINO device (default: the device setting).")
@settings_options
@cache_options
def explain_command(model: str, device: str | None, assignments: tuple[str, ...], store: CacheStore,
                    as_json: bool) -> None:
    """The fingerprint of MODEL on DEVICE with these settings, and whether a load would hit."""
    import openvino as ov

    from ovpool.cache.lookup import Lookup
    from ovpool.config import WorkerConfig
    from ovpool.worker.gguf.model import GGUFModel
    from ovpool.worker.graph.loading import batching_plan, cache_identity, choose_attention
    from ovpool.worker.graph.paged import PagedAttention

    worker, core = WorkerConfig.of(resolve_settings(assignments, device=device)), ov.Core()
    attention = choose_attention(worker.graph, worker.device, core, store.root)
    hook = PagedAttention() if attention == "paged" else None
    gguf = GGUFModel.open(model)
    identity, config = cache_identity(gguf, worker.with_graph(attention=attention), worker.device, core, hook)
    info = maintenance.explain(Lookup.create(core, store.root, identity, worker.device, config))
    info["batching"] = {mode: batching_plan(gguf, worker, worker.device, core, cache_dir=store.root,
                                            cache_only=mode == "cache-only")
                        for mode in ("default", "cache-only")}
    if as_json:
        emit_json(info)
        return
    click.echo(f"family: {info['family']}")
    for k, v in info["fingerprint"].items():
        click.echo(f"  {k}: {v}")
    click.echo(f"HIT {info['hit']}" if info["hit"] else f"MISS: {info['reason']}")
    click.echo(f"continuous batching: {info['batching']['default']}")
    click.echo(f"continuous batching in cache-only mode: {info['batching']['cache-only']}")


def register(group: click.Group) -> None:
    group.add_command(cache_group)
