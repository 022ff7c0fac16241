"""The C heap's free pages back to the system once a model is built.

Building a model unpacks every weight into numpy temporaries and frees them; glibc's malloc keeps
the pages of free chunks that lie below a used one (only the heap's top is given back on free), and
the CPU plugin's later allocations (its weight layouts at the first pass) rarely fit those holes.
``malloc_trim(0)`` hands back every whole free page: the bytes of live objects are untouched, so no
result changes (docs/performance.md, "gemma3-270m against llama.cpp")."""

from __future__ import annotations

import ctypes
import ctypes.util


def trim() -> bool:
    """Give the heap's free pages back to the system; False where the C library has no
    ``malloc_trim`` (not glibc), True otherwise."""
    name = ctypes.util.find_library("c")
    try:
        malloc_trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim(0)
    return True
