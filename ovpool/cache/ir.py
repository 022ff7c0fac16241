"""``load_ir``: a graph kept in the cache as OpenVINO IR (its XML and its weights as the graph's
own compressed constants), for a graph whose compiled form the device cannot import.

OpenVINO 2026.4's CPU plugin cannot import an exported paged-attention graph (the one a worker
batches with; ovpool.worker.graph.loading), so that graph is cached one step earlier: a start
reads the IR instead of reading the GGUF and building the graph, and the plugin compile remains.
That is not cache-only in the strict sense (a hit reads the IR's weights and compiles), which is
why it is an entry kind of its own: a family apart (fingerprint part ``cached form: IR``), logged
as ``model cache IR HIT/WROTE``. Reading the IR is faster than building from the GGUF; the
compile costs the same either way (docs/performance.md, "ovpool/cache/ir.py").

Blob: ``MAGIC``, the XML's length (u64, little-endian), the XML, zeros up to the next 4 KiB, the
weights. It is written like a compiled blob (temp file, fsync, rename, manifest last: an export
interrupted anywhere is never a hit) and checksummed in full before it is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from ovpool.cache.fingerprint import GraphIdentity
from ovpool.cache.loader import export_entry, exporting
from ovpool.cache.lookup import Lookup
from ovpool.cache.manifest import Entry
from ovpool.cache.store import CacheStore, crc32_of
from ovpool.errors import CacheCorruptError, CacheMissError

log = logging.getLogger("ovpool.cache")
FORM = "IR (compiled at every start)"
MAGIC = b"OVPIR001"
_HEADER = struct.Struct("<8sQ")
_ALIGN = 4096
# (the IR's XML, its weights) -> the model; the caller's, who knows the graph's custom ops.
Reader = Callable[[bytes, ov.Tensor], ov.Model]


class MappedWeights:
    """Owner of a hit's weights, a memory map of its blob: the graph's constants, and a graph
    compiled from them, may use those pages in place, so ``close`` only once both are unused."""

    def __init__(self, path: Path, offset: int):
        self.view = np.memmap(path, np.uint8, "c", offset=offset)  # copy-on-write: pages stay clean

    @property
    def pages(self) -> np.memmap | None:
        """The mapping (None once closed)."""
        return self.view

    def close(self) -> None:
        self.view = None  # unmapped once nothing else holds it

    def __enter__(self) -> MappedWeights:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class IrResult:
    """A graph to compile and how it came: ``outcome`` "hit" (read from the cache's IR, its
    weights mapped by ``weights``), "wrote" (built, its IR exported) or "built" (no usable cache)."""

    model: ov.Model
    outcome: str
    entry: str | None
    seconds: float
    weights: MappedWeights | None = None


def ir_lookup(core: ov.Core, cache_dir: str | Path, identity: GraphIdentity, device: str,
              config: dict, lock_timeout_s: float = -1) -> Lookup:
    """The lookup of ``identity``'s IR entry (its own family: see FORM)."""
    return Lookup.create(core, cache_dir, identity, device, config, lock_timeout_s, form=FORM)


def load_ir(core: ov.Core, *, identity: GraphIdentity, device: str, config: dict,
            build: Callable[[], ov.Model], read: Reader, cache_dir: str | Path | None,
            cache_only: bool, lock_timeout_s: float = -1) -> IrResult:
    """The graph of ``identity`` from its cached IR, else built (and its IR exported). Cache-only
    mode returns a hit or raises CacheMissError (CacheCorruptError for a bad entry, removed)."""
    start = time.perf_counter()
    if not cache_dir:
        return IrResult(build(), "built", None, time.perf_counter() - start)
    lookup = ir_lookup(core, cache_dir, identity, device, config, lock_timeout_s)
    (model, weights), entry, reason = _try_read(lookup, read, cache_only)
    if model is None:
        if cache_only:
            raise CacheMissError(
                f"model cache-only mode: no IR of the batching (paged) graph for "
                f"{', '.join(lookup.fp.models)} on {device} in {lookup.store.root}: {reason}. Start "
                "once without cache-only, with the same model, device and settings, to add it")
        log.info("model cache IR MISS %s: %s", lookup.family, reason)
        (model, weights), outcome, entry = _build_and_export(lookup, build, read)
    else:
        outcome = "hit"
    return IrResult(model, outcome, entry, time.perf_counter() - start, weights)


Read = tuple[ov.Model | None, MappedWeights | None]


def _try_read(lookup: Lookup, read: Reader, cache_only: bool) -> tuple[Read, str | None, str]:
    """((model, its weights), entry id, "") on a hit, else ((None, None), None, why it missed); a
    bad entry is removed (and raised in cache-only mode)."""
    try:
        entry, reason = lookup.find()
        if entry is None:
            return (None, None), None, reason
        found = _read_entry(lookup, entry, read)
    except CacheCorruptError as exc:
        if cache_only:
            raise
        log.warning("model cache: %s", exc)
        return (None, None), None, str(exc)
    lookup.store.record_hit(entry)
    log.info("model cache IR HIT %s", entry.id)
    return found, entry.id, ""


def _read_entry(lookup: Lookup, entry: Entry, read: Reader) -> Read:
    """The entry's graph, if its blob is whole (checksum) and parses; else it is dropped and
    CacheCorruptError raised."""
    try:
        blob = lookup.store.open_blob(entry)
        if (found := crc32_of(blob)) != entry.checksum:
            raise CacheCorruptError(f"blob {entry.blob} fails its checksum (expected {entry.checksum}, "
                                    f"found {found})")
        magic, xml_size = _HEADER.unpack_from(blob)
        weights = _weights_offset(xml_size)
        if magic != MAGIC or weights > len(blob):
            raise CacheCorruptError(f"blob {entry.blob} is not an ovpool IR")
        xml = bytes(blob[_HEADER.size:_HEADER.size + xml_size])
        mapped = MappedWeights(lookup.store.blob_path(entry), weights)
        return read(xml, ov.Tensor(mapped.view, shared_memory=True)), mapped
    except CacheCorruptError:
        lookup.drop(entry)
        raise
    except RuntimeError as exc:  # OpenVINO could not parse it
        lookup.drop(entry)
        raise CacheCorruptError(f"blob {entry.blob} does not read as IR: {_last_line(exc)}") from exc


def _build_and_export(lookup: Lookup, build: Callable[[], ov.Model],
                      read: Reader) -> tuple[Read, str, str | None]:
    with exporting(lookup, "building without exporting") as held:
        if not held:
            return (build(), None), "built", None
        found, entry, _ = _try_read(lookup, read, cache_only=False)  # exported while we waited?
        if found[0] is not None:
            return found, "hit", entry
        model = build()
        try:
            with _serialized(lookup.store, model) as chunks:
                written = export_entry(lookup, chunks)
        except OSError as exc:
            log.warning("model cache: IR export failed (%s); going on with the built graph", exc)
            return (model, None), "built", None
        log.info("model cache IR WROTE %s", written.id)
        return (model, None), "wrote", written.id


@contextlib.contextmanager
def _serialized(store: CacheStore, model: ov.Model) -> Iterator[Iterator[bytes]]:
    """The blob's bytes, from an IR serialized into tmp/ (removed afterwards)."""
    xml, weights = store.temp_path("ir", ".xml"), store.temp_path("ir", ".bin")
    try:
        ov.serialize(model, str(xml), str(weights))
        yield _blob_chunks(xml.read_bytes(), weights)
    finally:
        store.remove(xml)
        store.remove(weights)


def _blob_chunks(xml: bytes, weights: Path) -> Iterator[bytes]:
    head = _HEADER.pack(MAGIC, len(xml)) + xml
    yield head + bytes(_weights_offset(len(xml)) - len(head))
    with open(weights, "rb") as f:
        while block := f.read(16 << 20):
            yield block


def _weights_offset(xml_size: int) -> int:
    return -(-(_HEADER.size + xml_size) // _ALIGN) * _ALIGN


def _last_line(exc: Any) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
