"""GGUF quant blocks → integer codes + per-group scales, without expanding to float.

A ``Packed`` weight of shape [rows, cols] means, for column c in group g = c // group::

    W[r, c] = scale[r, g] * (code[r, c] - zero[r, g])

``zero`` may be absent (zero). The codes, scales and zero points are what OpenVINO's CPU plugin
fuses into its MatMul and Gather kernels (Convert codes, [Subtract zero point], Multiply scale).
Q4_1's and Q4_K's per-block minimum is any real number, not an integer zero point: rounding it to
one (as GenAI does) shifts every weight by up to half a quant step. Here those formats become
symmetric i4 codes (q - 8) with a float32 zero point, -(min + 8 * scale) / scale, which keeps the
minimum to float32 rounding; the CPU plugin fuses a float zero point as it fuses a u4 one, so the
exact weights cost no extra graph nodes. (An earlier form added the minimum as a separate
``groupsum(x) @ correction.T`` term: 420 more executed nodes on SmolLM2, 12% of the prefill's and
10% of a decode step's CPU time.) One compressed 3072x576 MatMul, one thread on this AVX2 CPU
(benchmarks/engine_matvec.py): 0.400 ms for one token vs 0.426 ms for GenAI's u4 + u4 zero
point, 23.7 vs 25.8 ms for 512 tokens. A group whose scale is 0 (all weights equal the minimum) gets
codes 0, scale 1 and zero point -min, also exact.

u4/i4 codes are stored packed as OpenVINO expects: element 2i in the low nibble of byte i. GGUF's
Q4 blocks store elements 0..15 in low nibbles and 16..31 in high nibbles, so they are repacked.
Pure numpy; the OpenVINO side lives in ovpool.worker.graph.weights.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from ovpool.errors import UnsupportedModelError

QK_K = 256


@dataclass(frozen=True)
class Packed:
    codes: np.ndarray  # [rows, cols] (u4/i4: [rows, cols // 2] packed bytes)
    element: str  # "f32", "f16", "bf16", "i8", "u8", "u4", "i4"
    shape: tuple[int, int]
    group: int = 0
    scale: np.ndarray | None = None  # [rows, groups] float16 or float32
    zero: np.ndarray | None = None  # [rows, groups] uint8 (u4 zero point) or float32 (exact)


def unpack(ggml_type: T, raw: np.ndarray, shape: tuple[int, ...]) -> Packed:
    """``raw`` (the tensor's bytes) as a Packed weight; 1-D tensors become one row."""
    rows, cols = (1, shape[0]) if len(shape) == 1 else (int(np.prod(shape[:-1])), shape[-1])
    if ggml_type in _FLOATS:
        codes = raw.view(_FLOATS[ggml_type]).reshape(rows, cols)
        return Packed(codes, _FLOAT_NAMES[ggml_type], (rows, cols))
    if ggml_type not in _UNPACKERS:
        raise UnsupportedModelError(f"weight type {ggml_type.name} is not supported")
    block, size = GGML_QUANT_SIZES[ggml_type]
    blocks = raw.reshape(rows * cols // block, size)
    return _UNPACKERS[ggml_type](blocks, rows, cols)


def dequantize(p: Packed) -> np.ndarray:
    """The float32 matrix ``p`` stands for (tests and the reference use it)."""
    if p.group == 0:
        codes = p.codes.view(np.int16) if p.element == "bf16" else p.codes
        return (codes.astype(np.int32) << 16).view(np.float32) if p.element == "bf16" \
            else codes.astype(np.float32)
    rows, cols = p.shape
    q = unpack_nibbles(p.codes, p.element) if p.element in ("u4", "i4") else p.codes
    q = q.reshape(rows, cols // p.group, p.group).astype(np.float32)
    if p.zero is not None:
        q = q - p.zero[..., None]
    return (q * p.scale.astype(np.float32)[..., None]).reshape(rows, cols)


def permute_rows(p: Packed, order: np.ndarray) -> Packed:
    """``p`` with its rows in ``order`` (a copy of each per-row array)."""
    pick = lambda a: None if a is None else np.ascontiguousarray(a[order])  # noqa: E731
    return replace(p, codes=pick(p.codes), scale=pick(p.scale), zero=pick(p.zero))


def concat_rows(parts: list[Packed]) -> Packed | None:
    """One Packed with the rows of ``parts`` stacked (one MatMul instead of several), or None
    when their encodings differ."""
    first = parts[0]
    same = all(p.element == first.element and p.group == first.group and p.shape[1] == first.shape[1]
               and (p.scale is None) == (first.scale is None)
               and (p.scale is None or p.scale.dtype == first.scale.dtype)
               and (p.zero is None) == (first.zero is None)
               and (p.zero is None or p.zero.dtype == first.zero.dtype) for p in parts)
    if not same:
        return None
    cat = lambda arrays: None if arrays[0] is None else np.concatenate(arrays)  # noqa: E731
    rows = sum(p.shape[0] for p in parts)
    return Packed(cat([p.codes for p in parts]), first.element, (rows, first.shape[1]), first.group,
                  cat([p.scale for p in parts]), cat([p.zero for p in parts]))


def requantize(p: Packed, scheme: str) -> Packed:
    """A K-quant weight re-encoded (lossy) in a scheme with 32-element groups: ``q8_sym32`` (i8,
    symmetric) or ``q4_asym32`` (u4 with a u4 zero point, GenAI's form, no correction term).
    The float rows exist only transiently, one tensor at a time."""
    rows, cols = p.shape
    w = dequantize(p).reshape(rows, cols // 32, 32)
    lo, hi = w.min(-1), w.max(-1)
    if scheme == "q8_sym32":
        scale = (np.maximum(-lo, hi) / 127).astype(np.float16)
        q = np.rint(_safe_div(w, scale)).clip(-127, 127).astype(np.int8)
        return Packed(q.reshape(rows, cols), "i8", p.shape, 32, scale)
    # s * (q - zero) with q, zero in 0..15 always represents 0, so the range must reach it.
    lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
    scale = ((hi - lo) / 15).astype(np.float16)
    zero = np.rint(_safe_div(-lo[..., None], scale))[..., 0].clip(0, 15).astype(np.uint8)
    q = (np.rint(_safe_div(w, scale)) + zero[..., None]).clip(0, 15).astype(np.uint8)
    return Packed(pack_nibbles(q.reshape(rows, cols)), "u4", p.shape, 32, scale, zero)


def _safe_div(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    s = scale.astype(np.float32)[..., None]
    return np.where(s == 0, 0, x / np.where(s == 0, 1, s))


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """u8 values < 16, [rows, cols] → OpenVINO u4 bytes [rows, cols // 2]."""
    return q[:, 0::2] | (q[:, 1::2] << np.uint8(4))


def unpack_nibbles(packed: np.ndarray, element: str) -> np.ndarray:
    lo, hi = packed & np.uint8(15), packed >> np.uint8(4)
    q = np.stack([lo, hi], axis=-1).reshape(packed.shape[0], -1)
    return (q.astype(np.int8) ^ 8) - 8 if element == "i4" else q


def widen(p: Packed) -> Packed:
    """``p`` with each 4-bit code in a byte of its own (i4 → i8, u4 → u8): the same values, scales
    and zero points. OpenVINO's CPU plugin repacks 4-bit weights for its kernels with a reference
    (non-JIT) reorder at the first inference of each kernel layout, 8-bit ones with a JIT one:
    SmolLM2's two set-ups take ~0.3 s instead of ~1 s."""
    if p.element not in ("i4", "u4"):
        return p
    return replace(p, codes=unpack_nibbles(p.codes, p.element), element=p.element.replace("4", "8"))


def _f16(blocks: np.ndarray, start: int, rows: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, start:start + 2]).view(np.float16).reshape(rows, -1)


def _i4_from_split_nibbles(qs: np.ndarray, rows: int) -> np.ndarray:
    """GGUF's nibble layout → OpenVINO i4 bytes of q - 8, straight from byte to byte.

    Each row of ``qs`` holds 2*n elements in n bytes: elements 0..n-1 in the low nibbles and
    n..2n-1 in the high nibbles (n = 16 for Q4_0/Q4_1 blocks, 32 for each Q4_K chunk). OpenVINO
    wants elements 2i, 2i+1 in byte i's low and high nibble; XOR 0x88 turns q into q - 8 in i4.
    """
    even, odd = qs[:, 0::2], qs[:, 1::2]
    low = (even & np.uint8(0x0F)) | (odd << np.uint8(4))
    high = (even >> np.uint8(4)) | (odd & np.uint8(0xF0))
    return (np.concatenate([low, high], axis=1) ^ np.uint8(0x88)).reshape(rows, -1)


def _affine_i4(codes: np.ndarray, cols: int, scale: np.ndarray, offset: np.ndarray, dtype) -> Packed:
    """W = scale * q + offset (q in 0..15, ``codes`` = q - 8 as i4) as scale * (codes - zero)
    with a float32 zero point (module docstring: why not an integer one)."""
    scale64, offset64 = scale.astype(np.float64), offset.astype(np.float64)
    flat = scale64 == 0
    zero = np.where(flat, -offset64, -8 - offset64 / np.where(flat, 1, scale64))
    if flat.any():  # W = offset whatever the code: codes 0, scale 1, zero point -offset
        codes = codes.reshape(*scale.shape, -1).copy()
        codes[flat] = 0
        codes = codes.reshape(scale.shape[0], -1)
        scale = np.where(flat, 1, scale)
    return Packed(codes, "i4", (codes.shape[0], cols), 32, scale.astype(dtype), zero.astype(np.float32))


def _q8_0(blocks, rows, cols) -> Packed:
    codes = np.ascontiguousarray(blocks[:, 2:]).view(np.int8).reshape(rows, cols)
    return Packed(codes, "i8", (rows, cols), 32, _f16(blocks, 0, rows))


def _q4_0(blocks, rows, cols) -> Packed:
    codes = _i4_from_split_nibbles(blocks[:, 2:], rows)
    return Packed(codes, "i4", (rows, cols), 32, _f16(blocks, 0, rows))


def _five_bit(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 32 codes (0..31) per block, u8 in element order: the low 4 bits of elements
    0..15 / 16..31 in the low / high nibbles of ``qs``, bit 4 of element j in bit j of ``qh``."""
    high = np.unpackbits(qh, axis=1, bitorder="little")
    return np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=1) | (high << np.uint8(4))


def _q5_0(blocks, rows, cols) -> Packed:
    # q - 16 in -16..15 as i8 (no 5-bit element type; u8 codes with a zero point of 16 would
    # add a Subtract to every weight for nothing): Q8_0's form, the same kernel and bytes.
    codes = (_five_bit(blocks[:, 2:6], blocks[:, 6:]).view(np.int8) - np.int8(16)).reshape(rows, cols)
    return Packed(codes, "i8", (rows, cols), 32, _f16(blocks, 0, rows))


def _q4_1(blocks, rows, cols) -> Packed:
    d, m = _f16(blocks, 0, rows), _f16(blocks, 2, rows)
    codes = _i4_from_split_nibbles(blocks[:, 4:], rows)
    return _affine_i4(codes, cols, d, m, np.float16)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes of 6-bit scales and mins for its 8 sub-blocks (llama.cpp's get_scale_min_k4)."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc, mn


def _q4_k(blocks, rows, cols) -> Packed:
    n = blocks.shape[0]
    d = _f16(blocks, 0, n).astype(np.float32)
    dmin = _f16(blocks, 2, n).astype(np.float32)
    sc, mn = _k_scale_min(blocks[:, 4:16])
    # Each 64-element chunk: 32 bytes, elements 0..31 in low nibbles, 32..63 in high nibbles.
    codes = _i4_from_split_nibbles(blocks[:, 16:].reshape(n * 4, 32), rows)
    scale = (d * sc).reshape(rows, -1)
    offset = -(dmin * mn).reshape(rows, -1)
    return _affine_i4(codes, cols, scale, offset, np.float32)


def _q6_k(blocks, rows, cols) -> Packed:
    n = blocks.shape[0]
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(blocks, 208, n).astype(np.float32)
    lo = (ql.reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & np.uint8(15)
    hi = (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    q = (lo.reshape(n, 2, 4, 32) | (hi.reshape(n, 2, 4, 32) << np.uint8(4))).astype(np.int8) - np.int8(32)
    return Packed(q.reshape(rows, cols), "i8", (rows, cols), 16, (d * sc).reshape(rows, -1))


_FLOATS = {T.F32: np.float32, T.F16: np.float16, T.BF16: np.uint16}
_FLOAT_NAMES = {T.F32: "f32", T.F16: "f16", T.BF16: "bf16"}
_UNPACKERS = {T.Q8_0: _q8_0, T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q4_K: _q4_k, T.Q6_K: _q6_k,
              T.Q5_0: _q5_0}
