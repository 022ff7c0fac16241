"""A fast GGUF (v2/v3) header parser: metadata and tensor infos, never a weight byte.

``gguf.GGUFReader`` builds a numpy view for every element of every metadata array (seconds for a
100k-entry vocabulary: docs/performance.md, file.py), far too slow for a serving load path. This
parser walks the header once with ``struct`` over a read-only mmap, so only the header's pages are
touched. It uses the gguf package's constants, and tests cross-check it against ``GGUFReader``.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.constants import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC

from ovpool.errors import ModelFormatError
from ovpool.worker.gguf.strings import decode_joined, short_string_starts

_SUPPORTED_VERSIONS = (2, 3)
_HEADER_PREFETCH = 1 << 20

# struct format and numpy dtype of each fixed-size value type (little-endian files only).
_SCALARS: dict[GGUFValueType, tuple[str, np.dtype]] = {
    GGUFValueType.UINT8: ("<B", np.dtype("<u1")),
    GGUFValueType.INT8: ("<b", np.dtype("<i1")),
    GGUFValueType.UINT16: ("<H", np.dtype("<u2")),
    GGUFValueType.INT16: ("<h", np.dtype("<i2")),
    GGUFValueType.UINT32: ("<I", np.dtype("<u4")),
    GGUFValueType.INT32: ("<i", np.dtype("<i4")),
    GGUFValueType.FLOAT32: ("<f", np.dtype("<f4")),
    GGUFValueType.BOOL: ("<?", np.dtype("?")),
    GGUFValueType.UINT64: ("<Q", np.dtype("<u8")),
    GGUFValueType.INT64: ("<q", np.dtype("<i8")),
    GGUFValueType.FLOAT64: ("<d", np.dtype("<f8")),
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's descriptor. ``shape`` is in numpy order (rows first, GGUF's dims reversed);
    ``offset`` is the absolute file offset of its first byte."""

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    data_offset: int
    file_size: int


class _Cursor:
    """Sequential little-endian reads over a buffer; running off its end is a format error."""

    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path
        self.size = len(buf)

    def fail(self, what: str, problem: str) -> ModelFormatError:
        return ModelFormatError(f"{self.path}: {problem} at byte {self.pos} while reading {what}; "
                                "the file is not a valid GGUF (truncated or corrupt?)")

    def scalar(self, fmt: str, what: str):
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error as exc:
            raise self.fail(what, "unexpected end of file") from exc
        self.pos += struct.calcsize(fmt)
        return value

    def string(self, what: str) -> str:
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(what, "invalid UTF-8 text") from exc

    def raw_string(self, what: str) -> bytes:
        n = self.scalar("<Q", what)
        end = self.pos + n
        if end > self.size:
            raise self.fail(what, f"string of {n} bytes runs past the end of the file")
        raw = self.buf[self.pos:end]
        self.pos = end
        return raw

    def value(self, vtype: int, what: str) -> Any:
        gtype = self.value_type(vtype, what)
        if gtype == GGUFValueType.STRING:
            return self.string(what)
        if gtype == GGUFValueType.ARRAY:
            return self.array(what)
        return self.scalar(_SCALARS[gtype][0], what)

    def value_type(self, vtype: int, what: str) -> GGUFValueType:
        try:
            return GGUFValueType(vtype)
        except ValueError as exc:
            raise self.fail(what, f"unknown value type {vtype}") from exc

    def array(self, what: str) -> Any:
        itype = self.value_type(self.scalar("<I", what), what)
        count = self.scalar("<Q", what)
        if count > self.size - self.pos:
            raise self.fail(what, f"array of {count} items is larger than the file")
        if itype == GGUFValueType.STRING:
            return self.string_array(count, what)
        if itype == GGUFValueType.ARRAY:
            return [self.array(what) for _ in range(count)]
        dtype = _SCALARS[itype][1]
        end = self.pos + count * dtype.itemsize
        if end > self.size:
            raise self.fail(what, f"array of {count} {itype.name} runs past the end of the file")
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos = end
        return values

    def string_array(self, count: int, what: str) -> list[str]:
        starts = self.string_starts(count, what)
        strings = decode_joined(self.buf, starts, self.pos)
        return self.decode_each(starts, what) if strings is None else strings

    def string_starts(self, count: int, what: str) -> np.ndarray:
        """Offsets of ``count`` length-prefixed strings from ``pos``, checked to lie inside the
        file; ``pos`` ends after them. What ``short_string_starts`` leaves, one step per item."""
        found, pos = short_string_starts(self.buf, self.pos, count)
        buf, unpack = self.buf, struct.Struct("<Q").unpack_from
        rest: list[int] = []
        append = rest.append
        try:
            for _ in range(count - found.size):
                append(pos)
                (n,) = unpack(buf, pos)  # past the end (a previous length too large) raises
                pos += 8 + n
        except (struct.error, OverflowError):
            pos = -1
        if not 0 <= pos <= self.size:
            # The bad item: the one whose prefix is cut, or the one before, whose length overshot.
            bad = len(rest) - 1 - (rest[-1] > self.size)
            self.pos = rest[bad]
            raise self.fail(what, f"unexpected end of file in item {found.size + bad}")
        self.pos = pos
        return np.concatenate((found, np.array(rest, np.int64)))

    def decode_each(self, offsets: np.ndarray, what: str) -> list[str]:
        """One decode per item: for the arrays ``decode_joined`` declines, naming a bad item."""
        starts = offsets.tolist()
        ends = [*starts[1:], self.pos]
        try:
            return [self.buf[a + 8:b].decode("utf-8") for a, b in zip(starts, ends, strict=True)]
        except UnicodeDecodeError:
            for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
                try:
                    self.buf[a + 8:b].decode("utf-8")
                except UnicodeDecodeError as exc:
                    self.pos = a
                    raise self.fail(what, f"invalid UTF-8 text in item {i}") from exc
            raise


def read_header(path: str | Path) -> GGUFHeader:
    """Parse ``path``'s header. Raises ModelFormatError naming what is wrong."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise ModelFormatError(f"{path}: {size} bytes is too short to be a GGUF file")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                _no_readahead_past_header(buf)
                return _parse(_Cursor(buf, path), size)
    except OSError as exc:
        raise ModelFormatError(f"{path}: cannot read the file: {exc.strerror or exc}") from exc


def _no_readahead_past_header(buf: mmap.mmap) -> None:
    # The kernel's fault read-ahead (8 MiB on some disks) would pull megabytes of weights into the
    # page cache behind the header, which a cache-only start must not read (tests count them with
    # mincore). Random access stops it; WILLNEED still fetches the first MiB in one go.
    buf.madvise(mmap.MADV_RANDOM)
    buf.madvise(mmap.MADV_WILLNEED, 0, min(len(buf), _HEADER_PREFETCH))


def _parse(cur: _Cursor, size: int) -> GGUFHeader:
    if cur.scalar("<I", "the magic number") != GGUF_MAGIC:
        raise ModelFormatError(f"{cur.path}: not a GGUF file (bad magic number)")
    version = cur.scalar("<I", "the version")
    if version not in _SUPPORTED_VERSIONS:
        raise ModelFormatError(f"{cur.path}: GGUF version {version} is not supported "
                               f"(supported: {', '.join(map(str, _SUPPORTED_VERSIONS))}; "
                               "big-endian files are not supported)")
    n_tensors = cur.scalar("<Q", "the tensor count")
    n_kv = cur.scalar("<Q", "the metadata count")
    metadata = _read_metadata(cur, n_kv)
    infos = [_read_tensor_info(cur) for _ in range(_bounded(cur, n_tensors, "tensor count"))]
    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ModelFormatError(f"{cur.path}: general.alignment = {alignment!r} is not a power of two")
    data_offset = -(-cur.pos // alignment) * alignment
    tensors = {}
    for name, ggml_type, shape, rel in infos:
        if name in tensors:
            raise ModelFormatError(f"{cur.path}: tensor {name!r} appears twice")
        tensors[name] = _tensor(cur.path, name, ggml_type, shape, data_offset + rel, size)
    return GGUFHeader(version, metadata, tensors, data_offset, size)


def _bounded(cur: _Cursor, count: int, what: str) -> int:
    # Every entry takes at least 8 bytes, so a count above size/8 can only be garbage.
    if count > cur.size // 8:
        raise cur.fail(what, f"{what} {count} is impossible for a {cur.size}-byte file")
    return count


def _read_metadata(cur: _Cursor, count: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for i in range(_bounded(cur, count, "metadata count")):
        key = cur.string(f"metadata key #{i}")
        if key in metadata:
            raise ModelFormatError(f"{cur.path}: metadata key {key!r} appears twice")
        metadata[key] = cur.value(cur.scalar("<I", f"the type of {key}"), f"metadata {key!r}")
    return metadata


def _read_tensor_info(cur: _Cursor) -> tuple[str, GGMLQuantizationType, tuple[int, ...], int]:
    name = cur.string("a tensor name")
    what = f"tensor info {name!r}"
    n_dims = cur.scalar("<I", what)
    if n_dims > 8:
        raise cur.fail(what, f"{n_dims} dimensions")
    dims = [cur.scalar("<Q", what) for _ in range(n_dims)]
    raw_type = cur.scalar("<I", what)
    try:
        ggml_type = GGMLQuantizationType(raw_type)
    except ValueError as exc:
        raise cur.fail(what, f"unknown tensor type {raw_type}") from exc
    offset = cur.scalar("<Q", what)
    return name, ggml_type, tuple(reversed(dims)), offset


def _tensor(path: Path, name: str, ggml_type: GGMLQuantizationType, shape: tuple[int, ...],
            offset: int, file_size: int) -> TensorInfo:
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if shape and shape[-1] % block:
        raise ModelFormatError(f"{path}: tensor {name!r} ({ggml_type.name}) has a row of "
                               f"{shape[-1]} elements, not a multiple of the block size {block}")
    nbytes = n // block * type_size
    if offset + nbytes > file_size:
        raise ModelFormatError(f"{path}: tensor {name!r} ends at byte {offset + nbytes}, past the "
                               f"end of the {file_size}-byte file (truncated download?)")
    return TensorInfo(name, ggml_type, shape, offset, nbytes)
