"""Parsed GGUF headers kept in the cache directory, so that a cache hit does not parse one again.

Most of a GGUF header is its tokenizer: SmolLM2's 49,152 tokens and 48,900 merges are ~100,000
length-prefixed strings, ~0.1 s of single-threaded Python to parse on the main thread of every
start, beside the blob import. The cache keeps each parsed header in ``marshal`` form (plain data:
loading it runs nothing), under a key of the file's path, and with the file's identity (device,
inode, size, mtime, ctime: what the fingerprint's source identity holds); loading it takes ~0.02 s.
A different identity, or an unreadable entry, is a miss: the header is parsed and written again.
Writing is best effort (a read-only cache directory only means parsing every time).
"""

from __future__ import annotations

import hashlib
import marshal
import os
from pathlib import Path

import numpy as np

from ovpool.cache.store import CacheStore
from ovpool.worker.gguf_file import GGMLQuantizationType, GGUFHeader, TensorInfo, read_header

_FORMAT = 1


def read_cached(path: Path, cache_dir: str | Path | None) -> GGUFHeader:
    """The header of the GGUF file ``path``: from ``cache_dir`` if it holds this file's, else
    parsed (and kept there for next time)."""
    if not cache_dir:
        return read_header(path)
    store, identity = CacheStore(cache_dir), _identity(path)
    entry = _entry_path(store, path)
    header = _load(entry, identity)
    if header is None:
        header = read_header(path)
        _save(store, entry, identity, header)
    return header


def _identity(path: Path) -> tuple[int, ...]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _entry_path(store: CacheStore, path: Path) -> Path:
    return store.headers_dir / f"{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]}.marshal"


def _load(entry: Path, identity: tuple[int, ...]) -> GGUFHeader | None:
    try:
        fmt, kept, version, metadata, tensors, data_offset, file_size = marshal.loads(entry.read_bytes())
        if fmt != _FORMAT or tuple(kept) != identity:
            return None
        infos = {name: TensorInfo(name, GGMLQuantizationType(kind), tuple(shape), offset, nbytes)
                 for name, kind, shape, offset, nbytes in tensors}
        values = {key: _array(v) if isinstance(v, tuple) else v for key, v in metadata.items()}
        return GGUFHeader(version, values, infos, data_offset, file_size)
    except (OSError, EOFError, ValueError, TypeError):  # none yet, or torn or foreign: parse again
        return None


def _array(kept: tuple) -> np.ndarray:
    dtype, shape, data = kept
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _save(store: CacheStore, entry: Path, identity: tuple[int, ...], header: GGUFHeader) -> None:
    tensors = [(t.name, int(t.ggml_type), t.shape, t.offset, t.nbytes) for t in header.tensors.values()]
    # Numeric arrays (token types, scores) as tuples: marshal would write any buffer as bytes, and
    # the parser never returns a tuple.
    metadata = {key: (value.dtype.str, value.shape, value.tobytes()) if isinstance(value, np.ndarray)
                else value for key, value in header.metadata.items()}
    try:
        data = marshal.dumps((_FORMAT, identity, header.version, metadata, tensors,
                              header.data_offset, header.file_size))
        store.prepare()
        store.write_bytes(entry, data)
    except (OSError, ValueError):  # read-only cache, or metadata marshal cannot hold: parse next time
        pass
