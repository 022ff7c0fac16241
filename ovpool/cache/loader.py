"""``load_compiled``: the one way the engine gets its compiled model (contract 6).

Hit: import the blob (no graph build, no weight read, no compile). Miss: take the family lock,
look again (a racing process may have exported meanwhile: then import its blob), else build,
compile with CACHE_MODE=OPTIMIZE_SPEED and export: blob to tmp/ → fsync → rename → manifest
through temp + fsync + rename, last; only then log ``model cache WROTE <entry>``. An export that
fails (disk full, read-only dir) costs a warning; the process goes on with its compiled model. So
does a family lock held past ``lock_timeout_s`` (setting cache_lock_timeout_s; a stopped or hung
holder): the wait is logged with the holder, then the process compiles without exporting.

Cache-only mode returns a hit or raises: CacheMissError naming what differs from the nearest
entry, CacheCorruptError for a bad entry (removed so the next normal start recompiles), and
CacheUnsupportedError for configurations that cannot avoid compiling (static shapes, CPU
fallback through HETERO/AUTO/MULTI, NPU).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import openvino as ov

from ovpool.cache import prefetch
from ovpool.cache.fingerprint import GraphIdentity, ports_key
from ovpool.cache.lookup import Lookup
from ovpool.cache.manifest import Entry, Manifest, is_static
from ovpool.cache.store import stream_chunks
from ovpool.devices import device_type
from ovpool.errors import (
    CacheCorruptError,
    CacheLockedError,
    CacheMissError,
    CacheUnsupportedError,
    ModelLoadError,
)

log = logging.getLogger("ovpool.cache")
# Devices that may split a graph or fall back to the CPU at run time: the blob is not one device's.
_VIRTUAL_DEVICES = ("HETERO", "AUTO", "MULTI", "BATCH")
_STATIC_ONLY_DEVICES = ("NPU",)
COMPILE_CONFIG = {"CACHE_MODE": "OPTIMIZE_SPEED"}


class Mapped(Protocol):
    """What holds a cache blob's memory map for a compiled model (prefetch.BlobImport,
    ovpool.cache.ir.MappedWeights)."""

    @property
    def pages(self) -> np.memmap | None: ...  # None once closed

    def close(self) -> None: ...


class Owner(Protocol):
    """What a built graph's memory belongs to, let go of by ``close`` once the compiled model is
    unused (the worker's ovpool.worker.graph.arena.ConstantArena)."""

    def close(self) -> None: ...


class DecodeHandle(Protocol):
    """A paged graph's decode graph (lone steps), compiled on demand beside it (the worker's
    ovpool.worker.graph.decode.DecodeGraph): the cache hands it on without looking inside."""

    def ready(self, wait: bool = False) -> ov.CompiledModel | None: ...

    def count_pass(self) -> None: ...


@dataclass(frozen=True)
class LoadResult:
    """A compiled graph and how it came; a context manager: a hit's compiled model runs on the
    mapped blob (``blob``), which ``close`` lets go of, so close it only once the model is unused."""

    compiled: ov.CompiledModel
    outcome: str  # "hit", "wrote" (compiled and exported), "compiled" (no cache or export skipped)
    # or "shared" (another user's compiled model, e.g. the worker's batcher reusing the engine's)
    entry: str | None
    seconds: float
    decode: DecodeHandle | None = None  # a paged graph's decode graph
    blob: Mapped | None = None  # a hit's import (prefetch.BlobImport), owner of the blob's memory map
    arena: Owner | None = None  # a built graph's constants

    def close(self) -> None:
        if self.blob is not None:
            self.blob.close()
        if self.arena is not None:
            self.arena.close()

    def __enter__(self) -> LoadResult:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_compiled(core: ov.Core, *, identity: GraphIdentity, device: str, config: dict,
                  build: Callable[[], ov.Model], cache_dir: str | Path | None,
                  cache_only: bool, hint: str | None = None,
                  early: prefetch.BlobImport | None = None, lock_timeout_s: float = -1) -> LoadResult:
    """The compiled graph; ``hint``: the key under which a hit or export is remembered for the next
    start's early import (ovpool.cache.prefetch; an engine's own graph only); ``early``: that
    import, begun by the caller, taken over by a hit on its blob (``result.blob is early``) and
    otherwise left to the caller to close; ``lock_timeout_s``: the longest wait for another
    process's cache lock (< 0: for ever)."""
    start = time.perf_counter()
    if "CACHE_DIR" in config:
        raise CacheUnsupportedError("OpenVINO's own CACHE_DIR is not used; pass cache_dir instead")
    if not cache_dir:
        if cache_only:
            raise CacheUnsupportedError("cache-only mode needs a cache directory: set --cache-dir "
                                        "or OVPOOL_CACHE_DIR")
        return LoadResult(compile_model(core, build(), device, config), "compiled", None, _since(start))
    if not _cacheable(device, identity, cache_only):
        return LoadResult(compile_model(core, build(), device, config), "compiled", None, _since(start))
    lookup = Lookup.create(core, cache_dir, identity, device, config, lock_timeout_s)
    hit, found = _try_hit(lookup, core, device, config, cache_only, early, hint)
    if hit is not None:
        return LoadResult(hit[0], "hit", found, _since(start), blob=hit[1])
    log.info("model cache MISS %s: %s", lookup.family, found)
    compiled, outcome, entry, blob = _compile_and_export(lookup, core, device, config, build, hint)
    return LoadResult(compiled, outcome, entry, _since(start), blob=blob)


def compile_model(core: ov.Core, model: ov.Model, device: str, config: dict) -> ov.CompiledModel:
    try:
        return core.compile_model(model, device, {**config, **COMPILE_CONFIG})
    except RuntimeError as exc:
        raise ModelLoadError(f"OpenVINO could not compile the model for {device}: {exc}") from exc


def _cacheable(device: str, identity: GraphIdentity, cache_only: bool) -> bool:
    kind = device_type(device)
    why = None
    if kind in _VIRTUAL_DEVICES:
        why = f"device {device} may fall back to another device (CPU fallback); name one device"
    elif kind in _STATIC_ONLY_DEVICES or is_static(identity.ports):
        why = f"static-shape graphs ({device}) are not cached; use a dynamic CPU or GPU graph"
    if why is None:
        return True
    if cache_only:
        raise CacheUnsupportedError(f"cache-only mode is unsupported here: {why}")
    log.warning("model cache: not used: %s", why)
    return False


def _try_hit(lookup: Lookup, core, device, config, cache_only, early=None,
             hint=None) -> tuple[tuple[ov.CompiledModel, prefetch.BlobImport] | None, str]:
    """((compiled, its blob's import), entry id) on a hit, else (None, why it missed); cache-only
    mode raises instead."""
    try:
        entry, reason = lookup.find()
        if entry is not None:
            hit = lookup.import_entry(core, entry, device, config, early)
            log.info("model cache HIT %s", entry.id)
            prefetch.remember(lookup.store, hint, entry.blob, device, config, entry.checksum)
            return hit, entry.id
    except CacheCorruptError as exc:
        if cache_only:
            raise CacheCorruptError(f"model cache-only mode: {exc}; the entry was removed, populate the "
                                    "cache again by starting once without cache-only") from exc
        reason = str(exc)
        log.warning("model cache: %s", reason)
    if cache_only:
        raise CacheMissError(f"model cache-only mode: no compiled model for {', '.join(lookup.fp.models)} "
                             f"on {device} in {lookup.store.root}: {reason}. Populate the cache by "
                             "starting once without cache-only, with the same model, device and settings")
    return None, reason


@contextlib.contextmanager
def exporting(lookup: Lookup, instead: str = "compiling without exporting") -> Iterator[bool]:
    """Hold the family lock for an export: True, or False (logged: ``instead``) where the cache
    cannot be written (read-only, permissions) or the lock stays held past its timeout."""
    with contextlib.ExitStack() as stack:
        try:
            lookup.store.prepare()
            stack.enter_context(lookup.store.lock(lookup.family))
        except OSError as exc:
            log.warning("model cache: %s is not writable (%s); %s", lookup.store.root, exc, instead)
            held = False
        except CacheLockedError as exc:
            log.warning("model cache: %s; %s", exc, instead)
            held = False
        else:
            held = True
        yield held


def _compile_and_export(lookup: Lookup, core, device, config, build,
                        hint) -> tuple[ov.CompiledModel, str, str | None, prefetch.BlobImport | None]:
    """(compiled, outcome, entry id, the blob's import if it was a hit after all)."""
    with exporting(lookup) as held:
        if not held:
            return compile_model(core, build(), device, config), "compiled", None, None
        # Look again: the process that held the lock before us may have exported this graph.
        hit, entry = _try_hit(lookup, core, device, config, cache_only=False, hint=hint)
        if hit is not None:
            return hit[0], "hit", entry, hit[1]
        compiled = compile_model(core, build(), device, config)
        try:
            with compiled.export_model() as stream:
                entry = export_entry(lookup, stream_chunks(stream))
        except OSError as exc:
            log.warning("model cache: export failed (%s); going on with the compiled model", exc)
            return compiled, "compiled", None, None
        log.info("model cache WROTE %s", entry.id)
        prefetch.remember(lookup.store, hint, entry.blob, device, config, entry.checksum)
        return compiled, "wrote", entry.id, None


def export_entry(lookup: Lookup, chunks: Iterable[bytes]) -> Entry:
    """Write ``chunks`` as the blob of ``lookup``'s entry, then the manifest naming it (last: an
    export interrupted anywhere is no entry). The caller holds the family lock."""
    store, fp = lookup.store, lookup.fp
    entry_id = f"{lookup.family}-{ports_key(lookup.ports)}"
    blob = f"{entry_id}.blob"
    size, checksum = store.write_blob(blob, chunks)
    try:
        try:
            manifest = store.manifest(lookup.family)
        except CacheCorruptError:
            manifest = None
        manifest = manifest or Manifest(lookup.family, dict(fp.parts), list(fp.models))
        entry = Entry(entry_id, lookup.ports, blob, size, checksum, fp.parts["openvino"],
                      fp.parts["device type"], time.time())
        store.commit(manifest.with_entry(entry))
    except BaseException:
        store.remove(store.blob_path(blob))
        raise
    return entry


def _since(start: float) -> float:
    return time.perf_counter() - start
