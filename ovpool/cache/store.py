"""The cache directory on disk: layout, locks, crash-safe writes, manifest and blob access.

::

    <cache_dir>/v1/
      manifests/<family>.json   one per graph family; entries inside
      blobs/<entry>.blob        exported CompiledModel (weights included)
      locks/<family>.lock       filelock; never deleted (deleting a held lock file splits waiters)
      locks/<family>.holder     who took the lock last (pid, host, time): what a waiter logs
      hits/<entry>.hits         one byte appended per hit: its size is the entry's hit count
      hints/<key>.json          the blob an engine's request last used (see ovpool.cache.prefetch)
      tmp/<name>.<pid>.<random>.partial[.xml|.bin]   while writing; gc removes those of dead processes
      sources.json              content hashes of GGUF files by file identity (source_identity=content)
      probes.json               device capabilities probed once per OpenVINO version (worker/graph/loading.py)
      kv/<namespace>/<address>.kv   KV blocks of the disk tier (ovpool.cache.kv)

Every file is written to tmp/, fsynced and renamed into place, so a reader sees the old file or
the new one, never a torn one. The manifest is renamed last, so an export interrupted anywhere
leaves no entry. A blob's last hit is its atime, set explicitly on each hit (no manifest rewrite
and no lock on the hot path; it works on noatime mounts too). Hits are counted the same way, off
the manifest and without a lock: an O_APPEND write of one byte is atomic, so racing hits all count.

Test hook: ``OVPOOL_CACHE_TEST_PAUSE=<phase>`` makes a writer print ``OVPOOL_CACHE_TEST_PAUSED
<phase>`` to stderr and wait for a signal at that phase, so a test can SIGKILL it there. Phases:
``blob-write`` (mid blob write), ``blob-renamed`` (blob in place, manifest not yet written),
``manifest-write`` (manifest temp written, not yet renamed).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import sys
import time
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ovpool import json_files, proc_state
from ovpool.cache.manifest import Entry, Manifest
from ovpool.errors import CacheCorruptError, CacheLockedError
from ovpool.settings import variable

log = logging.getLogger("ovpool.cache")
LAYOUT_VERSION = "v1"
LOCK_REPORT_S = 10.0  # a waiter logs who holds the lock this often
CHUNK_BYTES = 16 << 20
PAUSE_ENV = "OVPOOL_CACHE_TEST_PAUSE"


def test_pause(phase: str) -> None:
    """The documented test hook (see the module docstring); a no-op unless the env var names ``phase``."""
    if variable(PAUSE_ENV) == phase:
        sys.stderr.write(f"OVPOOL_CACHE_TEST_PAUSED {phase}\n")
        sys.stderr.flush()
        signal.pause()


def crc32_of(buffer: memoryview | np.ndarray) -> str:
    """``crc32:<hex>`` of a buffer, in chunks (zlib releases the GIL on each, so it overlaps import)."""
    view = memoryview(buffer).cast("B")
    crc = 0
    for start in range(0, len(view), CHUNK_BYTES):
        crc = zlib.crc32(view[start:start + CHUNK_BYTES], crc)
    return f"crc32:{crc:08x}"


class CacheStore:
    """One cache directory. Creating it touches nothing; writers call ``prepare()`` first.
    ``lock_timeout_s``: how long ``lock`` waits by default (setting cache_lock_timeout_s; < 0: for ever)."""

    def __init__(self, root: str | Path, lock_timeout_s: float = -1):
        self.root = Path(root).expanduser()
        self.lock_timeout_s = lock_timeout_s
        self.base = self.root / LAYOUT_VERSION
        self.manifests_dir, self.blobs_dir = self.base / "manifests", self.base / "blobs"
        self.locks_dir, self.tmp_dir = self.base / "locks", self.base / "tmp"
        self.hits_dir, self.hints_dir = self.base / "hits", self.base / "hints"
        self.probes_path = self.base / "probes.json"
        self.kv_dir = self.base / "kv"

    def prepare(self) -> None:
        """Create the layout; an OSError (read-only, permission) means exports must be skipped."""
        for d in (self.manifests_dir, self.blobs_dir, self.locks_dir, self.tmp_dir, self.hits_dir,
                  self.hints_dir):
            d.mkdir(parents=True, exist_ok=True)
        probe = self.tmp_dir / f"probe.{os.getpid()}.{secrets.token_hex(4)}.partial"
        probe.touch()
        probe.unlink()

    def manifest_path(self, family: str) -> Path:
        return self.manifests_dir / f"{family}.json"

    def blob_path(self, entry: Entry | str) -> Path:
        return self.blobs_dir / (entry.blob if isinstance(entry, Entry) else entry)

    def hint_path(self, key: str) -> Path:
        return self.hints_dir / f"{key}.json"

    def hits_path(self, entry: Entry | str) -> Path:
        """The hit counter of an entry (or of the blob named ``entry``)."""
        blob = Path(entry.blob if isinstance(entry, Entry) else entry)
        return self.hits_dir / blob.with_suffix(".hits").name

    @contextlib.contextmanager
    def lock(self, name: str, timeout: float | None = None) -> Iterator[None]:
        """Hold ``locks/<name>.lock``: wait up to ``timeout`` seconds (None: the store's
        ``lock_timeout_s``; < 0: for ever),
        then CacheLockedError naming the holder. A waiter logs the holder and its wait every
        LOCK_REPORT_S (a stopped or hung holder would otherwise block every start silently)."""
        import filelock  # here: a cache hit takes no lock, and the import costs start-up time

        timeout = self.lock_timeout_s if timeout is None else timeout
        lock = filelock.FileLock(self.locks_dir / f"{name}.lock", thread_local=False)
        start, step = time.monotonic(), 0.0
        while True:
            waited = time.monotonic() - start
            if timeout >= 0:
                step = min(step, max(0.0, timeout - waited))
            try:
                lock.acquire(timeout=step)
                break
            except filelock.Timeout:
                waited = time.monotonic() - start
                if timeout >= 0 and waited >= timeout:
                    raise CacheLockedError(f"cache lock {name} is still held by {self._holder(name)}"
                                           f" after {waited:.1f} s (setting cache_lock_timeout_s)") from None
                log.warning("model cache: lock %s is held by %s; waited %.0f s so far%s", name,
                            self._holder(name), waited, f" of {timeout:g}" if timeout >= 0 else "")
                step = LOCK_REPORT_S
        holder = self.locks_dir / f"{name}.holder"
        try:
            with contextlib.suppress(OSError):  # only for the log of a waiter
                holder.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                              "since": time.time()}))
            yield
        finally:
            self.remove(holder)
            lock.release()

    def _holder(self, name: str) -> str:
        """``pid 123 on host, for 12 s (stopped)`` from the holder file, as far as it can be read."""
        try:
            h = json_files.loads((self.locks_dir / f"{name}.holder").read_text())
            who = f"pid {h['pid']} on {h['host']}, for {time.time() - h['since']:.0f} s"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"
        if h["host"] == socket.gethostname() and proc_state.stopped(h["pid"]):
            who += " (it is stopped: SIGSTOP or a debugger)"
        return who

    # Reading -----------------------------------------------------------------------------------

    def manifest(self, family: str) -> Manifest | None:
        """The family's manifest, None if it has none; CacheCorruptError if it is garbage."""
        try:
            text = self.manifest_path(family).read_bytes()
        except FileNotFoundError:
            return None
        return Manifest.from_json(text, family)

    def families(self) -> list[str]:
        if not self.manifests_dir.is_dir():
            return []
        return sorted(p.stem for p in self.manifests_dir.glob("*.json"))

    def readable_manifests(self) -> Iterator[Manifest]:
        """Every manifest that parses (garbage ones are skipped here; lookups report them)."""
        for family in self.families():
            with contextlib.suppress(CacheCorruptError):
                manifest = self.manifest(family)
                if manifest is not None:
                    yield manifest

    def open_blob(self, entry: Entry) -> np.memmap:
        """The blob as a read-only memmap; its existence and size are checked."""
        self.check_blob(entry)
        return np.memmap(self.blob_path(entry), dtype=np.uint8, mode="r")

    def check_blob(self, entry: Entry) -> None:
        """CacheCorruptError unless the entry's blob exists with the size the entry records."""
        try:
            size = self.blob_path(entry).stat().st_size
        except FileNotFoundError as exc:
            raise CacheCorruptError(f"blob {entry.blob} of entry {entry.id} is missing") from exc
        if size != entry.size:
            raise CacheCorruptError(f"blob {entry.blob} has {size} bytes, its entry says {entry.size}")

    def last_hit(self, entry: Entry) -> float:
        try:
            return max(self.blob_path(entry).stat().st_atime, entry.created)
        except FileNotFoundError:
            return entry.created

    def hits(self, entry: Entry) -> int:
        try:
            return self.hits_path(entry).stat().st_size
        except FileNotFoundError:
            return 0

    def record_hit(self, entry: Entry) -> None:
        """Set the blob's atime to now (the LRU clock of gc) and count the hit; silently nothing on
        a read-only dir."""
        path = self.blob_path(entry)
        with contextlib.suppress(OSError):
            os.utime(path, (time.time(), path.stat().st_mtime))
        with contextlib.suppress(OSError):
            self.hits_dir.mkdir(exist_ok=True)  # a cache written before hits were counted
            with open(self.hits_path(entry), "ab") as f:
                f.write(b".")

    # Writing (callers hold the family lock) ----------------------------------------------------

    def write_blob(self, name: str, chunks: Iterable[bytes]) -> tuple[int, str]:
        """Write ``chunks`` (an exported model: see ``stream_chunks``; a cached IR) to
        ``blobs/<name>`` crash-safely, so no second in-memory copy is made; returns (size, checksum)."""
        crc, size = 0, 0

        def counted() -> Iterator[bytes]:
            nonlocal crc, size
            for block in chunks:
                crc, size = zlib.crc32(block, crc), size + len(block)
                yield block

        self._atomic_write(self.blob_path(name), counted(), "blob-write")
        self.remove(self.hits_path(name))  # a new blob: the hits of one dropped before are not its own
        test_pause("blob-renamed")
        return size, f"crc32:{crc:08x}"

    def temp_path(self, name: str, suffix: str = "") -> Path:
        """A fresh ``tmp/`` path for ``name`` (gc removes it once its process is dead); ``suffix``
        for writers that insist on one (OpenVINO's serializer: ``.xml``)."""
        return self.tmp_dir / f"{name}.{os.getpid()}.{secrets.token_hex(4)}.partial{suffix}"

    def commit(self, manifest: Manifest) -> None:
        """Replace the family's manifest in one rename: the moment its entries become hits."""
        self._atomic_write(self.manifest_path(manifest.family), [manifest.to_json().encode()],
                           "manifest-write")

    def write_text(self, path: Path, text: str) -> None:
        self._atomic_write(path, [text.encode()], "text-write")

    def write_file(self, path: Path, chunks: Iterable[bytes], phase: str) -> None:
        """Write ``chunks`` to ``path`` crash-safely (tmp/ + fsync + rename); ``phase``: the test
        hook's name for a pause mid-write."""
        self._atomic_write(path, chunks, phase)

    def remove(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def drop_entry(self, family: str, entry_id: str, expected: Entry | None = None) -> bool:
        """Remove an entry (manifest first, then its blob); with ``expected``, only if it is still
        that exact entry (another process may have replaced it). The caller holds the family lock."""
        try:
            manifest = self.manifest(family)
        except CacheCorruptError:
            return False
        entry = manifest.entries.get(entry_id) if manifest else None
        if entry is None or (expected is not None and entry != expected):
            return False
        rest = manifest.without(entry_id)
        if rest.entries:
            self.commit(rest)
        else:
            self.remove(self.manifest_path(family))
        self.remove(self.blob_path(entry))
        self.remove(self.hits_path(entry))
        return True

    def drop_family(self, family: str) -> None:
        """Remove a family's manifest and every blob and hit counter named after it. The caller
        holds its lock."""
        self.remove(self.manifest_path(family))
        for path in [*self.blobs_dir.glob(f"{family}-*.blob"), *self.hits_dir.glob(f"{family}-*.hits")]:
            self.remove(path)

    def _atomic_write(self, final: Path, chunks: Iterable[bytes], phase: str) -> None:
        tmp = self.temp_path(final.name)
        try:
            with open(tmp, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                    test_pause(phase)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, final)
        except BaseException:
            self.remove(tmp)
            raise
        _fsync_dir(final.parent)


def stream_chunks(stream: BinaryIO) -> Iterator[bytes]:
    """A file-like object's bytes from its start, CHUNK_BYTES at a time."""
    stream.seek(0)
    while block := stream.read(CHUNK_BYTES):
        yield block


def _fsync_dir(path: Path) -> None:
    # The rename itself must reach the disk before anything that depends on it (the manifest).
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
