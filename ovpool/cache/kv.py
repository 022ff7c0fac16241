"""The prefix cache's disk tier: KV blocks that outlive a worker, shared by the host's workers.

::

    <cache_dir>/v1/kv/<namespace>/<address>.kv

``namespace`` is the cache family of the paged graph that computed the blocks (model file
identity, graph settings, the graph builder's hash, OpenVINO version, device type and CPU ISA:
ovpool.cache.fingerprint), ``address`` a block's chain hash (ovpool.worker.generate.blocks: its
tokens, how each position was computed, everything before it and the KV layout), in hex. So a block
is only ever read by a graph that would have computed the same bytes. A file is a 32-byte header
(``MAGIC``, the payload's length, its crc32) and the block's bytes, written to tmp/ + fsync +
rename (``CacheStore.write_file``): a reader sees a whole block or none, and of two processes
writing one block the last rename wins with the same bytes. A file whose size, magic or crc32 is
wrong is a miss and is removed; a ``.kv`` that is not a regular file (a symlink, a FIFO) is a
miss left alone, and no read takes more than one block's bytes. A block's last use is its mtime
(set on every hit): the tier's LRU clock, and that of the cache directory's budget (ovpool.cache.budget).

Writes run on a thread of their own, off the step loop; a write that fails (disk full, read-only
or unwritable directory) logs one warning and turns writing off for the process; reads go on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ovpool.cache.kv_ram import RamTier
from ovpool.cache.store import CacheStore

log = logging.getLogger("ovpool.cache")
MAGIC = b"OVPKV001"
HEADER = struct.Struct("<8sQI12x")  # magic, payload length, crc32 of the payload; 32 bytes
SUFFIX = ".kv"
# Blocks copied out but not yet written beyond this are dropped (a slow disk must not grow memory).
MAX_PENDING_BYTES = 64 << 20
# Past the budget, the oldest blocks go until the tier is this fraction of it (one scan per many writes).
EVICT_TO = 0.9
# The whole directory's budget (ovpool.cache.budget) is checked each time this much more is written.
DIR_CHECK_BYTES = 64 << 20


def pack(payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def unpack(data: bytes) -> bytes | None:
    """A block file's payload, or None if it is not a whole, intact block file."""
    if len(data) < HEADER.size:
        return None
    magic, length, crc = HEADER.unpack_from(data)
    payload = data[HEADER.size:]
    if magic != MAGIC or length != len(payload) or zlib.crc32(payload) != crc:
        return None
    return payload


def blocks(kv_dir: Path) -> list[tuple[float, int, Path]]:
    """(last use, size, path) of every block file under ``kv_dir``, oldest first."""
    found = []
    for path in kv_dir.glob(f"*/*{SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            st = path.stat()
            found.append((st.st_mtime, st.st_size, path))
    return sorted(found)


def trim(kv_dir: Path, budget_bytes: int, to_bytes: int | None = None) -> tuple[list[str], int]:
    """If the tier holds more than ``budget_bytes``, remove its least recently used blocks until it
    holds ``to_bytes`` (default: the budget); (names removed, bytes left)."""
    found = blocks(kv_dir)
    left, removed = sum(size for _, size, _ in found), []
    if left <= budget_bytes:
        return removed, left
    for _, size, path in found:
        if left <= (budget_bytes if to_bytes is None else to_bytes):
            break
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            left -= size
            removed.append(path.name)
    return removed, left


def check(kv_dir: Path) -> list[dict]:
    """Every block file with ``ok`` and, if not, its ``problem`` (``ovpool cache verify``). A
    ``.kv`` that is not a regular file (a symlink, FIFO or directory) is flagged, never read; a
    regular one is checked a chunk at a time (its length against its header, then its crc32)."""
    results = []
    for _, size, path in blocks(kv_dir):
        try:
            fd = _open_regular(path)
        except OSError:
            fd = None
        if fd is None:
            problem = "not a regular file"
        else:
            try:
                whole = _whole(fd, size)
            except OSError:
                whole = False
            finally:
                os.close(fd)
            problem = None if whole else f"not a whole block ({size} bytes, or its crc32 differs)"
        results.append({"block": f"{path.parent.name}/{path.name}", "ok": problem is None,
                        "problem": problem})
    return results


def _open_regular(path: Path) -> int | None:
    """A read-only descriptor of ``path`` if it is a regular file, else None (a symlink is not
    followed, a FIFO not waited on); OSError if it is not there."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd


def _read(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _whole(fd: int, size: int) -> bool:
    """Whether the open block file of ``size`` bytes is whole: magic, length and crc32."""
    head = _read(fd, HEADER.size)
    if len(head) < HEADER.size:
        return False
    magic, length, crc = HEADER.unpack(head)
    if magic != MAGIC or HEADER.size + length != size:
        return False
    running = 0
    while chunk := os.read(fd, 1 << 20):
        running = zlib.crc32(chunk, running)
    return running == crc


class DiskTier:
    """The blocks of one ``namespace`` in ``store``'s cache directory, within ``budget_bytes`` for
    the whole tier (every namespace); a context manager (it owns the writer thread). ``dir_check``
    keeps the whole cache directory within its budget: called every DIR_CHECK_BYTES written."""

    def __init__(self, store: CacheStore, namespace: str, budget_bytes: int,
                 dir_check: Callable[[], object] | None = None):
        self.store, self.budget_bytes, self._dir_check = store, budget_bytes, dir_check
        self._unchecked = DIR_CHECK_BYTES  # written since the last dir_check: one runs at the first write
        self.dir = store.kv_dir / namespace
        self.writable = True
        self._pending: deque[tuple[bytes, bytes]] = deque()
        self._pending_bytes = 0
        self._usage: int | None = None  # bytes of the whole tier, as of the last scan plus writes
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.stats = {"hits": 0, "misses": 0, "corrupt": 0, "read_bytes": 0, "read_s": 0.0,
                      "writes": 0, "written_bytes": 0, "write_s": 0.0, "dropped": 0, "evicted": 0}

    def path(self, address: bytes) -> Path:
        return self.dir / f"{address.hex()}{SUFFIX}"

    def get(self, address: bytes, size: int) -> bytes | None:
        """The block's ``size`` bytes, or None: not there or not a regular file (a symlink, FIFO or
        directory: a miss, left alone), or damaged (a file of another length than a block of
        ``size``, or a wrong magic or crc32: then removed). Reads at most the one block's bytes."""
        path, start = self.path(address), time.perf_counter()
        want = HEADER.size + size
        try:
            fd = _open_regular(path)
        except OSError:
            fd = None
        if fd is None:
            self.stats["misses"] += 1
            return None
        try:
            length = os.fstat(fd).st_size
            data = _read(fd, want) if length == want else b""
        except OSError:
            self.stats["misses"] += 1
            return None
        finally:
            os.close(fd)
        payload = unpack(data) if len(data) == want else None
        if payload is None:
            log.warning("KV tier: %s is damaged (%d bytes): removed, the block is recomputed",
                        path, length)
            self.stats["corrupt"] += 1
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):  # the LRU clock; nothing on a read-only directory
            os.utime(path)
        self.stats["hits"] += 1
        self.stats["read_bytes"] += len(data)
        self.stats["read_s"] += time.perf_counter() - start
        return payload

    def put(self, address: bytes, payload: bytes) -> None:
        """Write the block (on the writer thread) unless it is there already."""
        if not self.writable or self._closed:
            return
        with self._wake:
            if self._pending_bytes + len(payload) > MAX_PENDING_BYTES:
                self.stats["dropped"] += 1
                return
            self._pending.append((address, payload))
            self._pending_bytes += len(payload)
            self._wake.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._writes, name="ovpool-kv-tier", daemon=True)
            self._thread.start()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every block put so far is written (or dropped), at most ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._wake:
            while self._pending_bytes and time.monotonic() < deadline:
                self._wake.wait(0.05)

    def _writes(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if not self._pending:
                    return
                address, payload = self._pending[0]
            try:
                self._write(address, payload)
            except Exception:  # the writer must drain its queue (close waits for it) whatever happens
                self.writable = False
                log.exception("KV tier: the writer failed; the disk tier takes no more blocks")
            with self._wake:
                self._pending.popleft()
                self._pending_bytes -= len(payload)
                self._wake.notify_all()

    def _write(self, address: bytes, payload: bytes) -> None:
        path = self.path(address)
        if not self.writable or _size(path) == HEADER.size + len(payload):
            return  # another worker (or an earlier pass) wrote it; a truncated one is replaced
        start = time.perf_counter()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.store.tmp_dir.mkdir(parents=True, exist_ok=True)
            self.store.write_file(path, [pack(payload)], "kv-write")
        except OSError as exc:
            self.writable = False
            log.warning("KV tier: writing %s failed (%s): the disk tier takes no more blocks in this "
                        "process; it still reads the ones there", path, exc)
            return
        self.stats["writes"] += 1
        self.stats["written_bytes"] += HEADER.size + len(payload)
        self.stats["write_s"] += time.perf_counter() - start
        self._account(HEADER.size + len(payload))

    def _account(self, written: int) -> None:
        """Keep the whole tier within its budget, oldest blocks out first."""
        self._unchecked += written
        if self._dir_check is not None and self._unchecked >= DIR_CHECK_BYTES:
            self._unchecked = 0
            self._dir_check()
        if self._usage is None:
            self._usage = sum(size for _, size, _ in blocks(self.store.kv_dir))
        else:
            self._usage += written
        if self._usage > self.budget_bytes:
            removed, self._usage = trim(self.store.kv_dir, self.budget_bytes,
                                        int(self.budget_bytes * EVICT_TO))
            self.stats["evicted"] += len(removed)

    def close(self) -> None:
        """Write what is pending (bounded by ``flush``'s timeout), then stop the writer."""
        self.flush()
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> DiskTier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def open_tier(cache_dir: str | Path | None, entry: str | None, budget_mb: int,
              dir_check: Callable[[], object] | None = None, ram_mb: int = 0) -> DiskTier | RamTier | None:
    """The disk tier for the paged graph of cache entry ``entry`` (its family is the namespace),
    under a RAM tier of ``ram_mb`` (ovpool.cache.kv_ram) if that is not 0; None without a cache
    directory or an entry."""
    if not cache_dir or not entry:
        return None
    disk = DiskTier(CacheStore(cache_dir), entry.split("-", 1)[0], budget_mb << 20, dir_check)
    return RamTier(disk, ram_mb << 20) if ram_mb else disk
