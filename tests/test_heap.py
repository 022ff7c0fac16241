"""heap.trim gives the C heap's free pages back: what a model's build freed leaves the process."""

import ctypes
import ctypes.util
import platform

import pytest

from ovpool.worker import heap

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")


def _anon_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


@glibc
def test_trim_returns_the_pages_of_chunks_freed_below_a_live_one():
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 << 10, 1024  # under the mmap threshold: heap chunks, 64 MiB in all
    chunks = [libc.malloc(size) for _ in range(count)]
    for chunk in chunks:
        ctypes.memset(chunk, 1, size)
    pin = chunks.pop()  # the heap's top stays in use, so free alone gives nothing back
    for chunk in chunks:
        libc.free(chunk)
    before = _anon_kib()
    assert heap.trim()
    assert before - _anon_kib() > 48 << 10  # most of the 64 MiB
    libc.free(pin)
