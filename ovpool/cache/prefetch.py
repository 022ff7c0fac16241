"""Importing blobs on threads, and starting a likely hit's import before its lookup.

A hit's import and checksum (SmolLM2 on a 2-core CPU: ~0.2 s) need only the blob, but which blob
is known only once the fingerprint is computed: after the graph builder's modules are imported and
the GGUF header is read, ~0.3 s of single-threaded Python in a fresh process. So each hit or export
of an engine's graph leaves a hint: under a key of what a process knows before any of that (the
model file and its identity, the device, the graph settings as given), the blob it used and the
compile config. ``start`` (ovpool's commands call it before importing the engine and hand the
import to it; an Engine given none calls it itself) looks the hint up and begins importing that
blob and computing its checksum, on two threads (OpenVINO's import and zlib release the GIL). The
caller holds the BlobImport and hands it to its load (``load_compiled(early=...)``), which takes it
over only if the fingerprint chose the same blob file (same inode, size and mtime), device and
config, and still checks the checksum against the entry: a stale hint costs CPU time, never a
wrong model.

A hint also keeps its blob's checksum, so the import can go on to the compiled model's first pass
(``first_pass``, the caller's: ovpool.worker.graph.first_pass) on the same thread, once the blob's
crc32 equals the hint's: the CPU plugin lays every weight matrix out for its kernels at the first
pass of a shape class (more CPU than the import: docs/performance.md, "Start on a cache hit"), which
otherwise waits for the engine's first request. A blob that fails its hint's checksum never runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from ovpool import json_files
from ovpool.cache.fingerprint import stat_identity
from ovpool.cache.store import CacheStore, crc32_of
from ovpool.config import GraphConfig
from ovpool.errors import CacheCorruptError, CacheError, OvpoolError
from ovpool.models import resolve_model_path
from ovpool.settings import Settings


class BlobImport:
    """One blob being imported (``core.import_model``) and checksummed, each on its own thread; the
    owner of the blob's memory map, so a context manager.

    The compiled model it imports runs on the mapped bytes, and OpenVINO keeps no reference to the
    mapping (closing it under a live compiled model crashes the process, measured): close it only
    after every user of the compiled model is gone. Whoever holds the import closes it: the load
    result that took it over (``LoadResult.close``), else whoever began it.
    """

    def __init__(self, core: ov.Core, path: Path, device: str, config: Mapping[str, Any], *,
                 checksum: str | None = None, first_pass: FirstPass | None = None):
        self.path, self.device, self.config = Path(path), device, dict(config)
        with open(self.path, "rb") as f:  # the identity of exactly the file that gets mapped
            self.identity = _identity(os.fstat(f.fileno()))
            # Copy-on-write: pages stay clean, shared with other workers through the page cache.
            self.blob: np.memmap | None = np.memmap(f, dtype=np.uint8, mode="c")
        pool = ThreadPoolExecutor(2, thread_name_prefix="ovpool-blob")
        self._compiled = pool.submit(_import, core, self.blob, device, self.config, self.path.name)
        self._checksum = pool.submit(crc32_of, self.blob)
        # Queued behind the two: it starts once the checksum is done, and waits for the import.
        # Only with a pass to run: the task holds the mapping until it has run.
        self.set_up: Future[bool] = _done(False)
        if first_pass is not None and checksum is not None:
            self.set_up = pool.submit(self._first_pass, self.blob, checksum, first_pass)
        pool.shutdown(wait=False)  # the threads end with their work

    @property
    def pages(self) -> np.memmap | None:
        """The blob's mapping (None once closed)."""
        return self.blob

    def close(self) -> None:
        """Let go of the mapping: unmapped once the import's own threads are done with it too. The
        compiled model goes first: its future here was the last reference to it in a worker that
        had moved on to its batching graph (~250 MiB of a warm-cache SmolLM2 worker)."""
        self._compiled = self._checksum = None
        self.blob = None

    def __enter__(self) -> BlobImport:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def serves(self, path: Path, size: int, device: str, config: Mapping[str, Any]) -> bool:
        """Whether this import is of the file now at ``path`` (``size`` bytes), for ``device``
        and ``config``."""
        try:
            current = _identity(os.stat(path))
        except OSError:
            return False
        return (Path(path) == self.path and current == self.identity and current[1] == size
                and device == self.device and dict(config) == self.config)

    def _first_pass(self, blob: np.memmap, checksum: str, first_pass: FirstPass) -> bool:
        """Run ``first_pass`` on the compiled model if the blob is the one the hint checksummed;
        whether it ran. ``blob``: the mapping, an argument so that it stays mapped while the pass
        reads it even if the import is closed meanwhile."""
        compiled, found = self._compiled, self._checksum
        if compiled is None or found.result() != checksum:
            return False
        try:
            first_pass(compiled.result())
        except (RuntimeError, OvpoolError):  # advice only: the engine's own first pass reports it
            return False
        return len(blob) > 0

    def result(self) -> tuple[ov.CompiledModel, str]:
        """(compiled model, ``crc32:<hex>`` of the blob), once both threads are done; a blob
        OpenVINO cannot import raises CacheCorruptError."""
        if self._compiled is None:
            raise CacheError(f"the import of {self.path.name} was closed")
        checksum = self._checksum.result()
        return self._compiled.result(), checksum


FirstPass = Callable[[ov.CompiledModel], object]


def _done(value: bool) -> Future[bool]:
    future: Future[bool] = Future()
    future.set_result(value)
    return future


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_dev


def _import(core: ov.Core, blob: np.memmap, device: str, config: dict, name: str) -> ov.CompiledModel:
    try:
        return core.import_model(ov.Tensor(blob, shared_memory=True), device, config)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else type(exc).__name__
        raise CacheCorruptError(f"OpenVINO cannot import blob {name}: {first}") from exc


def hint_key(model_path: str | Path, device: str, graph: GraphConfig | Settings | Mapping[str, Any]) -> str:
    """The hint key of an engine's request: model path and file identity, device, graph settings."""
    parts = [str(model_path), stat_identity(model_path), device, GraphConfig.coerce(graph).values()]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def remember(store: CacheStore, key: str | None, blob: str, device: str, config: Mapping[str, Any],
             checksum: str) -> None:
    """Point ``key``'s hint at ``blob`` (with its ``checksum``) unless it already does; a read-only
    cache keeps its old one."""
    if key is None:
        return
    text = json.dumps({"blob": blob, "device": device, "config": dict(config), "checksum": checksum},
                      sort_keys=True)
    path = store.hint_path(key)
    with contextlib.suppress(OSError):
        if path.is_file() and path.read_text() == text:
            return
        store.hints_dir.mkdir(exist_ok=True)  # a cache written before hints
        store.write_text(path, text)


def start(model: str | Path, device: str | None, graph: GraphConfig | Settings | Mapping[str, Any],
          cache_dir: str | Path | None = None, core: ov.Core | None = None,
          first_pass: FirstPass | None = None) -> BlobImport | None:
    """Begin importing the blob that an Engine of ``model`` on ``device`` with the ``graph``
    settings and ``cache_dir`` used last, if the cache has a hint for it; the import begun (the
    caller's to hand to that Engine, as ``early``), or None. Without a cache directory, hint or
    blob the engine loads as it would have. ``first_pass``: run on the imported model once the
    blob's checksum equals the hint's (see the module docstring)."""
    if isinstance(graph, Settings):  # the Engine's call shape until it passes its WorkerConfig
        device, cache_dir = device or graph.device, cache_dir or graph.cache_dir
    if not cache_dir:
        return None
    device = device or "CPU"
    store = CacheStore(cache_dir)
    # A hint is only advice: whatever is wrong with it (or the model argument) is left to the
    # engine's own load to find and report.
    with contextlib.suppress(OvpoolError, OSError, ValueError, KeyError, TypeError):
        key = hint_key(resolve_model_path(model), device, graph)
        hint = json_files.loads(store.hint_path(key).read_text())
        blob = store.blobs_dir / Path(hint["blob"]).name
        return BlobImport(core or ov.Core(), blob, hint["device"], hint["config"],
                          checksum=hint.get("checksum"), first_pass=first_pass)
    return None
