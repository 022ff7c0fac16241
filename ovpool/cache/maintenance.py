"""Operator actions on a cache directory: list, show, verify, gc, rm (used by ``ovpool cache``).

Every removal happens under the family's lock, so it never races an export: gc skips a family
whose lock is held (an export in progress may have renamed its blob but not yet its manifest).
An entry is stale when it can never match again (``stale``): its model file is gone or changed
(stat identity), or another graph builder or OpenVINO version wrote it; what this ovpool writes
(``Current``) comes from the caller, since the cache does not import the worker's graph builder.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovpool import json_files
from ovpool.cache import budget, kv
from ovpool.cache.budget import try_lock
from ovpool.cache.fingerprint import stat_identity
from ovpool.cache.manifest import Entry, Manifest
from ovpool.cache.store import CacheStore, crc32_of
from ovpool.errors import CacheCorruptError, CacheError, CacheMissError

if TYPE_CHECKING:  # a type only: importing lookup imports OpenVINO, which `ovpool cache ls` never needs
    from ovpool.cache.lookup import Lookup

_TEMP_NAME = re.compile(r"^.+\.(?P<pid>\d+)\.[0-9a-f]+\.partial(\.xml|\.bin)?$")


@dataclass(frozen=True)
class Current:
    """What this ovpool would write: its graph builder's hash and its OpenVINO version."""

    builder_hash: str
    openvino: str


def stale(manifest: Manifest, current: Current | None) -> str | None:
    """Why no start can match the manifest's entries again, or None."""
    parts = manifest.parts
    for i, path in enumerate(manifest.models):
        if f"model[{i}] sha256" in parts:
            continue  # content identity: a copy of the file elsewhere still matches
        try:
            here = stat_identity(path)
        except OSError:
            return f"its model file {path} is gone"
        if any(str(v) != parts.get(f"model[{i}] {k}") for k, v in here.items()):
            return f"its model file {path} was replaced or touched since"
    if current is not None and parts.get("graph builder") != current.builder_hash:
        return "another ovpool graph builder wrote it"
    if current is not None and parts.get("openvino") != current.openvino:
        return f"OpenVINO {parts.get('openvino')} wrote it (this is {current.openvino})"
    return None


def entries(store: CacheStore) -> Iterator[tuple[Manifest, Entry]]:
    for manifest in store.readable_manifests():
        for entry in manifest.entries.values():
            yield manifest, entry


def describe(store: CacheStore, manifest: Manifest, entry: Entry,
             current: Current | None = None) -> dict[str, Any]:
    """One entry as `ls` and `show` report it; ``last_hit`` None if it was never hit."""
    parts = manifest.parts
    return {
        "entry": entry.id, "family": manifest.family, "models": manifest.models,
        "form": parts.get("cached form", "compiled model"),  # or ovpool.cache.ir's FORM
        "architecture": parts.get("architecture"),
        # The ISA flags as words, so a table can wrap them (AMX hosts list eleven).
        "device": f"{parts.get('device type')} ({str(parts.get('device architecture')).replace('+', ' ')})",
        "settings": {k[len("setting "):]: v for k, v in parts.items() if k.startswith("setting ")},
        "ports": entry.ports, "size": entry.size, "checksum": entry.checksum,
        "openvino": entry.openvino, "created": entry.created,
        "last_hit": store.last_hit(entry) if store.hits(entry) else None, "hits": store.hits(entry),
        "stale": stale(manifest, current),
        "blob": str(store.blob_path(entry)),
    }


def find(store: CacheStore, entry_id: str) -> tuple[Manifest, Entry]:
    """The entry named ``entry_id`` (a unique prefix is enough)."""
    found = [(m, e) for m, e in entries(store) if e.id.startswith(entry_id)]
    if len(found) != 1:
        what = "matches no entry" if not found else f"matches {len(found)} entries; give more characters"
        raise CacheMissError(f"{entry_id!r} {what} in {store.root} (see `ovpool cache ls`)")
    return found[0]


def show(store: CacheStore, entry_id: str) -> dict[str, Any]:
    manifest, entry = find(store, entry_id)
    return {**describe(store, manifest, entry), "fingerprint": manifest.parts, "raw": asdict(entry)}


def unreadable(store: CacheStore) -> list[dict[str, Any]]:
    """Every manifest that cannot be read, with its ``problem`` (``gc`` removes them)."""
    results = []
    for family in store.families():
        try:
            store.manifest(family)
        except CacheCorruptError as exc:
            results.append({"entry": None, "family": family, "ok": False, "problem": str(exc)})
    return results


def verify(store: CacheStore) -> list[dict[str, Any]]:
    """Every manifest, entry and KV block with ``ok`` and, if not ok, ``problem`` (full checksums)."""
    results = unreadable(store)
    for _, entry in entries(store):
        results.append({"entry": entry.id, **_check_blob(store, entry)})
    return results + kv.check(store.kv_dir)


def sizes(store: CacheStore) -> dict[str, int]:
    """Bytes by kind: compiled-model blobs, IR blobs, the KV tier, the rest; and in all."""
    ir_families = {m.family for m in store.readable_manifests() if "cached form" in m.parts}
    found = {"compiled": 0, "ir": 0, "kv": 0, "kv_blocks": 0}
    for blob in store.blobs_dir.glob("*.blob") if store.blobs_dir.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):
            found["ir" if blob.name.split("-", 1)[0] in ir_families else "compiled"] += blob.stat().st_size
    for _, size, _ in kv.blocks(store.kv_dir):
        found["kv"] += size
        found["kv_blocks"] += 1
    total = budget.usage(store) if store.base.is_dir() else 0
    return {**found, "other": total - found["compiled"] - found["ir"] - found["kv"], "total": total}


def _check_blob(store: CacheStore, entry: Entry) -> dict[str, Any]:
    last_hit = store.last_hit(entry)
    try:
        found = crc32_of(store.open_blob(entry))
        problem = None if found == entry.checksum else f"checksum {found}, expected {entry.checksum}"
    except (CacheCorruptError, OSError) as exc:
        problem = str(exc)
    with contextlib.suppress(OSError):  # reading may bump the atime; it is gc's LRU clock
        os.utime(store.blob_path(entry), (last_hit, store.blob_path(entry).stat().st_mtime))
    return {"ok": problem is None, "problem": problem}


def explain(lookup: Lookup) -> dict[str, Any]:
    """The fingerprint's parts, and the entry a load would hit or why it would miss (read-only)."""
    try:
        entry, reason = lookup.find(repair=False)
    except CacheCorruptError as exc:
        entry, reason = None, str(exc)
    return {"family": lookup.family, "fingerprint": dict(lookup.fp.parts), "ports": lookup.ports,
            "hit": entry.id if entry else None, "reason": reason or None}


def remove(store: CacheStore, entry_id: str) -> str:
    manifest, entry = find(store, entry_id)
    with _writing(store), store.lock(manifest.family):
        store.drop_entry(manifest.family, entry.id)
    return entry.id


def gc(store: CacheStore, max_bytes: int | None = None, current: Current | None = None,
       kv_bytes: int | None = None) -> dict[str, Any]:
    """Remove dead writers' temp files, garbage manifests, unreferenced blobs (and hit counters),
    stale entries (see ``stale``) no live process maps, the KV tier's least recently used blocks
    beyond ``kv_bytes``, then least recently used entries and blocks while the directory holds
    more than ``max_bytes`` (ovpool.cache.budget), then start-up hints naming no blob
    (ovpool.cache.prefetch). Returns what was removed, by kind, and ``freed_bytes``: how much
    smaller the directory is."""
    before = disk_usage(store)
    report = _collect(store, max_bytes, current, kv_bytes)
    return {**report, "freed_bytes": max(0, before - disk_usage(store))}


def disk_usage(store: CacheStore) -> int:
    """Bytes of every file under the cache directory."""
    return sum(p.stat().st_size for p in store.base.rglob("*") if p.is_file()) if store.base.is_dir() else 0


def _collect(store: CacheStore, max_bytes: int | None, current: Current | None,
             kv_bytes: int | None) -> dict[str, list[str]]:
    with _writing(store):
        report = {"temp": _dead_temps(store), "manifests": [], "blobs": [],
                  "stale": _stale_entries(store, current), "kv": [], "entries": []}
        for family in _blob_families(store) | set(store.families()):
            with try_lock(store, family) as held:
                if held:
                    _gc_family(store, family, report)
        if kv_bytes is not None:
            report["kv"] = kv.trim(store.kv_dir, kv_bytes)[0]
        if max_bytes is not None:
            report["entries"] = budget.enforce(store, max_bytes)
        report["hints"] = _stale_hints(store)
    return report


def _stale_entries(store: CacheStore, current: Current | None) -> list[str]:
    """Remove every stale entry no live process maps; their ids, each with why."""
    held, removed = budget.mapped(store), []
    for manifest in list(store.readable_manifests()):
        reason = stale(manifest, current)
        for entry in manifest.entries.values() if reason else ():
            if entry.blob in held:
                continue
            with try_lock(store, manifest.family) as free:
                if free and store.drop_entry(manifest.family, entry.id, expected=entry):
                    removed.append(f"{entry.id} ({reason})")
    return removed


def _stale_hints(store: CacheStore) -> list[str]:
    """Hints whose blob is gone, or that cannot be read: harmless (a start imports nothing for
    them), but they would pile up."""
    removed = []
    for path in store.hints_dir.glob("*.json") if store.hints_dir.is_dir() else []:
        try:
            blob = store.blob_path(Path(json_files.loads(path.read_text())["blob"]).name)
            stale = not blob.is_file()
        except (OSError, ValueError, KeyError, TypeError):
            stale = True
        if stale:
            store.remove(path)
            removed.append(path.name)
    return removed


@contextlib.contextmanager
def _writing(store: CacheStore) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise CacheError(f"cannot modify the cache at {store.root}: {exc.strerror or exc} "
                         "(read-only, or another user's?)") from exc


def _dead_temps(store: CacheStore) -> list[str]:
    removed = []
    for path in store.tmp_dir.glob("*.partial*") if store.tmp_dir.is_dir() else []:
        match = _TEMP_NAME.match(path.name)
        if match and not _alive(int(match["pid"])):
            store.remove(path)
            removed.append(path.name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _blob_families(store: CacheStore) -> set[str]:
    """Families named by a blob or a hit counter (either may outlive its manifest)."""
    paths = [*store.blobs_dir.glob("*.blob"), *store.hits_dir.glob("*.hits")]
    return {p.name.split("-", 1)[0] for p in paths}


def _gc_family(store: CacheStore, family: str, report: dict[str, list[str]]) -> None:
    try:
        manifest = store.manifest(family)
    except CacheCorruptError:
        report["blobs"].extend(p.name for p in store.blobs_dir.glob(f"{family}-*.blob"))
        store.drop_family(family)  # its blobs too: no manifest can name them again
        report["manifests"].append(family)
        return
    referenced = {e.blob for e in manifest.entries.values()} if manifest else set()
    for blob in store.blobs_dir.glob(f"{family}-*.blob"):
        if blob.name not in referenced:
            store.remove(blob)
            report["blobs"].append(blob.name)
    counted = {store.hits_path(blob) for blob in referenced}
    for hits in store.hits_dir.glob(f"{family}-*.hits"):
        if hits not in counted:  # its entry is gone (a hit raced the removal): not a report item
            store.remove(hits)
