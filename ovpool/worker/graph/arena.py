"""Where a built graph's weight constants live: pages of a file the process maps, which it hands
back once the CPU plugin has laid the weights out for its kernels.

The CPU plugin repacks each compressed MatMul's weights into its kernels' layout (a dynamic graph at
its first pass, a static one while compiling) but keeps the model's own constants alive for as
long as the compiled model lives, and never reads them again except the embedding rows a Gather
looks up. In anonymous memory they stay resident. In a shared mapping of a file the same bytes can
leave the process (``madvise(MADV_DONTNEED)``) and come back from the page cache, unchanged, if
anything reads them again (an export, a kernel layout for a new shape, a looked-up row). So the
arena drops its pages on a thread of its own: no caller has to know when the plugin is done
reading (after a warm-up, a decode graph's compile, an export). While pages come back fast (a
compile reading the constants in a burst) it releases every ``RELEASE_PERIOD_S``, so those reads
stay resident for a moment only; while they come back slowly (looked-up rows) it waits twice as
long each time, up to ``IDLE_PERIOD_S``, and is back at the short period once a release finds a
burst. A graph imported from the cache runs on its blob's (or IR's) copy-on-write mapping the
same way; ``adopt`` has the arena release that mapping's clean pages too. The measurements behind
this: docs/performance.md, "ovpool/worker/graph/arena.py".

The file is unlinked from the start, in ``tempfile.gettempdir()`` (``TMPDIR``). On tmpfs its pages
would be memory all the same, so there, and wherever the file cannot be made or grown, the
constants stay in anonymous memory (``ConstantArena.open`` returns None; ``tensor`` returns None).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import tempfile
import threading
from pathlib import Path

import numpy as np
import openvino as ov

CHUNK = 64 << 20  # bytes mapped at a time (a constant larger than this gets a mapping of its own)
# Short while a burst of reads lasts: what a compile read stays resident until the next release,
# and the peak RSS of a load rises with this period.
RELEASE_PERIOD_S = 0.005
IDLE_PERIOD_S = 0.64  # the longest wait: looked-up rows stay resident that long at most
# Pages coming back faster than this are a burst (a compile or an export reads constants at
# tens of MiB/s; a decode step looks up one embedding row).
BURST_BYTES_PER_S = 4 << 20
_ALIGN = 64  # as OpenVINO aligns its own tensors


class ConstantArena:
    """Shared file mappings that hold constants; a context manager (it owns the file and a thread).

    ``tensor`` hands out ov.Tensors over the mapping. A mapping stays mapped while any tensor over
    it lives (a compiled model's constants keep theirs), so ``close`` only stops the releases."""

    def __init__(self, file):
        self._file = file
        self._maps: list[mmap.mmap] = []
        self._adopted: list[np.memmap] = []  # file mappings of others (see ``adopt``)
        self._size = self._used = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._burst = threading.Event()  # set by ``burst``: pages are about to come back
        self._thread: threading.Thread | None = None
        self.release_period_s: float | None = RELEASE_PERIOD_S  # None: only ``release`` calls

    @classmethod
    def open(cls, directory: str | Path | None = None) -> ConstantArena | None:
        """An arena in ``directory`` (default: the temporary directory), or None on tmpfs or
        where no file can be made there."""
        directory = Path(directory or tempfile.gettempdir())
        if filesystem(directory) in ("tmpfs", "ramfs"):
            return None
        try:
            return cls(tempfile.TemporaryFile(dir=directory))
        except OSError:
            return None

    def tensor(self, element: ov.Type, shape) -> ov.Tensor | None:
        """An uninitialised tensor in the arena, or None if the file cannot grow (a full disk)."""
        shape = [int(d) for d in shape]
        nbytes = -(-int(np.prod(shape, dtype=np.int64)) * element.bitwidth // 8)
        with self._lock:
            memory = self._take(max(nbytes, 1))
        if memory is None:
            return None
        self._start()
        return ov.Tensor(memory[:nbytes], ov.Shape(shape), element)

    def _take(self, nbytes: int) -> np.ndarray | None:
        if not self._maps or self._used + nbytes > len(self._maps[-1]):
            size = max(CHUNK, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
            try:
                # Allocated now: a hole written through a mapping on a full disk is a SIGBUS.
                os.posix_fallocate(self._file.fileno(), self._size, size)
                self._maps.append(mmap.mmap(self._file.fileno(), size, offset=self._size))
            except OSError:
                return None
            self._size, self._used = self._size + size, 0
        start = self._used
        self._used += -(-nbytes // _ALIGN) * _ALIGN
        return np.frombuffer(self._maps[-1], np.uint8, nbytes, start)

    @property
    def size(self) -> int:
        """Bytes of file mapped."""
        return self._size

    def adopt(self, view: np.memmap) -> None:
        """Release ``view``'s pages with the arena's: a copy-on-write file mapping (a cache blob's
        or IR's) that a compiled model reads its constants from in place and never writes, so its
        pages are clean and come back from the file unchanged. Kept mapped until ``close``."""
        if not isinstance(view, np.memmap):  # the pages around any other array are not its own
            raise TypeError(f"adopt takes a np.memmap, not {type(view).__name__}")
        with self._lock:
            self._adopted.append(view)
        self._start()

    def release(self) -> None:
        """Drop every page of the arena (and of adopted mappings) from this process; the page
        cache keeps the bytes."""
        with self._lock:
            for m in self._maps:
                m.madvise(mmap.MADV_DONTNEED)
            for view in self._adopted:
                _dont_need(view)

    def burst(self) -> None:
        """Pages are about to come back in a burst (a first pass lays every weight out for the
        kernels): release at the short period from now, not after the long wait a quiet spell has
        grown to, which a first pass can outlast with every page it read still resident."""
        self._burst.set()

    def _start(self) -> None:
        if self._thread is None and not self._stop.is_set() and self.release_period_s:
            self._thread = threading.Thread(target=self._releases, name="ovpool-arena", daemon=True)
            self._thread.start()

    def _releases(self) -> None:
        period = self.release_period_s
        while not self._stop.is_set():
            if self._burst.wait(period):
                self._burst.clear()
                period = self.release_period_s
                continue
            if self._stop.is_set():
                return
            before = file_rss()
            self.release()
            after = file_rss()
            dropped = None if before is None or after is None else before - after
            period = next_period(period, dropped, self.release_period_s, IDLE_PERIOD_S)

    def close(self) -> None:
        self._stop.set()
        self._burst.set()  # wakes the thread
        if self._thread is not None:
            self._thread.join()
        self._adopted.clear()
        with contextlib.suppress(OSError):
            self._file.close()  # the mappings keep the unlinked file's pages until they go

    def __enter__(self) -> ConstantArena:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def next_period(period: float, dropped: int | None, short: float, idle: float) -> float:
    """The wait before the next release, ``dropped`` bytes having left at the last one after
    ``period`` (None: unknown): ``short`` while pages come back in a burst, else twice the last
    wait, up to ``idle``."""
    if dropped is None or dropped >= BURST_BYTES_PER_S * period:
        return short
    return min(period * 2, idle)


def file_rss(statm: str = "/proc/self/statm") -> int | None:
    """Bytes of file (and shared memory) pages resident in this process; None if unknown."""
    try:
        with open(statm) as f:
            return int(f.read().split()[2]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return None


_LIBC = ctypes.CDLL(None, use_errno=True)


def _dont_need(view: np.memmap) -> None:
    """madvise(MADV_DONTNEED) over the pages ``view`` touches: a memmap's mapping covers them whole."""
    start = view.ctypes.data // mmap.PAGESIZE * mmap.PAGESIZE
    end = -(-(view.ctypes.data + view.nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE
    if end > start:
        _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_DONTNEED)


def filesystem(path: Path, mounts: str | Path = "/proc/self/mounts") -> str:
    """The type of the file system holding ``path`` (its longest mount point), "" if unknown."""
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return ""
    path, best, kind = os.path.realpath(path), "", ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return kind
