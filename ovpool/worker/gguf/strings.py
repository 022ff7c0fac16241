"""A GGUF string array's items (a vocabulary: ~10^5 of them) read in bulk, exactly as one decode
per item would, declining (None, or fewer items) wherever that is not certain.

A Python step per item was most of a model open (docs/performance.md, model swaps): the items'
offsets are found with NumPy, and the text is decoded once and split.
"""

from __future__ import annotations

import numpy as np

# Windows of short_string_starts: bounded so a scan past a vocabulary's end stays within a few
# pages (a cache-only start must not fault in weight pages).
_WINDOW = 1 << 16
_SHORT = 256  # a string this long or longer ends the vectorized walk


def short_string_starts(buf, pos: int, count: int) -> tuple[np.ndarray, int]:
    """The leading strings' offsets (and the offset after them), found a window at a time without
    a Python step per item: where the 8-byte prefix of a string under 256 bytes starts, the next
    seven bytes are zero. Every such spot is a candidate; consecutive candidates are accepted
    while each one's length leads exactly to the next, so what is accepted is what a walk finds.
    The first mismatch (a longer string, or a spot inside a string that looks like a prefix)
    ends it: the caller walks on from there, so a hostile file costs one window more."""
    chunks: list[np.ndarray] = []
    done = 0
    while done < count:
        end = min(len(buf), pos + min(_WINDOW, (count - done) * (8 + _SHORT)))
        if end - pos < 8:
            break
        lengths = np.ndarray((end - pos - 7,), "<u8", buf, pos, (1,))
        found = np.flatnonzero(lengths < _SHORT)
        if found.size == 0 or found[0] != 0:
            break
        following = found + 8 + lengths[found].astype(np.int64)
        breaks = np.flatnonzero(found[1:] != following[:-1])
        chained = int(breaks[0]) + 1 if breaks.size else found.size
        taken = min(chained, count - done)
        if pos + int(following[taken - 1]) > len(buf):
            taken -= 1  # the last one runs past the end: the walk names it
        chunks.append(found[:taken] + pos)
        done += taken
        if taken:
            pos += int(following[taken - 1])
        if taken < found.size:
            break
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int64), pos


# Each 8-byte length prefix keeps its first byte (zeroed: the separator) and drops the other seven.
_PREFIX_KEPT = np.array([True] + [False] * 7)


def decode_joined(buf, starts: np.ndarray, end: int) -> list[str] | None:
    """The strings at ``starts`` (``end``: past the last one) decoded in one pass: prefixes become
    one NUL each, the whole is decoded once and split at the NULs. NUL is ASCII, so the whole is
    valid UTF-8 exactly when every item is; None (decode them one by one) when an item is not
    valid UTF-8 or contains a NUL itself, so the NUL count would not match."""
    if not starts.size:
        return []
    raw = np.frombuffer(buf, np.uint8, end - int(starts[0]), int(starts[0]))
    offsets = starts - starts[0]
    keep = np.ones(raw.size, bool)
    windows = np.lib.stride_tricks.as_strided(keep, (raw.size - 7, 8), (1, 1))
    windows[offsets] = _PREFIX_KEPT
    joined = raw[keep]
    joined[offsets - 7 * np.arange(offsets.size)] = 0
    try:
        strings = joined.tobytes().decode("utf-8").split("\x00")
    except UnicodeDecodeError:
        return None
    return strings[1:] if len(strings) == offsets.size + 1 else None
