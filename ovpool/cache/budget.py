"""One size budget for a whole cache directory: compiled-model entries and KV tier blocks, least
recently used first across both.

An entry's last use is its last hit (its blob's atime, set on every hit; its creation time if it
was never hit), a KV block's its mtime (set on every load: ovpool.cache.kv). ``enforce`` runs as
things are written (after an engine's export, and as the KV tier writes) and from ``ovpool cache
gc``. It never removes an entry whose blob a live process maps (a worker running on it: found in
/proc/*/maps, so on this host), and removes an entry only under its family's lock, and only if the
manifest still holds that exact entry (as every removal does: docs/cache.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ovpool.cache import kv
from ovpool.cache.manifest import Entry
from ovpool.cache.store import CacheStore
from ovpool.errors import CacheLockedError

log = logging.getLogger("ovpool.cache")


@dataclass(frozen=True)
class Item:
    """One thing the budget may remove: an entry (``family`` and ``entry`` set) or a KV block."""

    last_use: float
    size: int
    path: Path  # the blob, or the block file
    family: str = ""
    entry: Entry | None = None


def items(store: CacheStore) -> list[Item]:
    """Every entry and KV block of the directory, least recently used first."""
    found = [Item(store.last_hit(e), e.size, store.blob_path(e), m.family, e)
             for m in store.readable_manifests() for e in m.entries.values()]
    found += [Item(when, size, path) for when, size, path in kv.blocks(store.kv_dir)]
    return sorted(found, key=lambda item: item.last_use)


def usage(store: CacheStore) -> int:
    """Bytes of every file under the directory."""
    total = 0
    for root, _, files in os.walk(store.base):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


def mapped(store: CacheStore, proc: Path = Path("/proc")) -> set[str]:
    """Names of the blobs some process on this host maps (a live worker's compiled model runs on them)."""
    prefix, names = str(store.blobs_dir.resolve()) + os.sep, set()
    for maps in proc.glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            for line in maps.read_text().splitlines():
                fields = line.split(maxsplit=5)  # address, perms, offset, dev, inode, path
                if len(fields) == 6 and fields[5].startswith(prefix):
                    names.add(fields[5][len(prefix):])
    return names


def enforce(store: CacheStore, max_bytes: int) -> list[str]:
    """Remove least recently used entries and blocks until the directory holds at most
    ``max_bytes``; the names of what went."""
    total = usage(store)
    if total <= max_bytes:
        return []
    held, removed = mapped(store), []
    for item in items(store):
        if total <= max_bytes:
            break
        if item.entry is not None and (item.path.name in held or not _drop(store, item)):
            continue
        if item.entry is None:
            with contextlib.suppress(FileNotFoundError):
                item.path.unlink()
        total -= item.size
        removed.append(item.entry.id if item.entry else item.path.name)
    if removed:
        log.info("model cache over its budget (%d MiB): removed %d least recently used entr(y/ies) "
                 "and KV blocks", max_bytes >> 20, len(removed))
    return removed


def _drop(store: CacheStore, item: Item) -> bool:
    with try_lock(store, item.family) as held:
        return held and store.drop_entry(item.family, item.entry.id, expected=item.entry)


@contextlib.contextmanager
def try_lock(store: CacheStore, family: str) -> Iterator[bool]:
    """Hold the family lock if it is free now; False if an export holds it."""
    try:
        with store.lock(family, timeout=0):
            yield True
    except CacheLockedError:
        yield False


def keep_within(cache_dir: str | Path | None, max_mb: int) -> list[str]:
    """``enforce`` on ``cache_dir`` (nothing without one); a directory it cannot change is left
    as it is (a read-only cache)."""
    if not cache_dir:
        return []
    try:
        return enforce(CacheStore(cache_dir), max_mb << 20)
    except OSError as exc:
        log.warning("model cache %s: cannot keep it within cache_max_mb: %s", cache_dir, exc)
        return []
