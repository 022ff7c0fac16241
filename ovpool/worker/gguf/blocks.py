"""GGUF quant blocks → Packed weights (ovpool.worker.gguf.quants), one function per weight type.

Each type takes the form the CPU plugin fuses into its compressed MatMul and Gather, chosen by
measurement (benchmarks/weight_types.py; docs/architecture.md has the table):

- Q8_0, Q5_0, IQ4_NL: i8 codes, an f16 scale per 32 (Q5_0's codes are q - 16: there is no 5-bit
  element type; IQ4_NL's codes are its codebook's values, which all fit in i8).
- Q4_0: i4 codes.
- Q4_1, Q4_K: u4 codes q with an exact offset (below); Q5_1, Q5_K: u8 codes q (0..31), the same.
- Q6_K: i8 codes, an f32 scale per 16; IQ4_XS: codebook values as i8, an f32 scale per 32.
- Q3_K: i4 codes (-4..3), an f32 scale per 16; Q2_K: u2 codes with f32 scales and offsets
  per 16. (K-quant scales are an f16 times a 4..6-bit integer: f16 would round them.)

Q4_1's and Q4_K's per-block minimum is any real number, not an integer zero point: rounding it to
one (as GenAI does) shifts every weight by up to half a quant step. Here those formats keep the
file's own formula, W = scale * q + offset, with the codes q unsigned and the offset (the minimum,
an f16 or an f16 times a 6-bit integer) exact in float32, as is each scale * q. The graph takes
this form (``zero_points=offset``) or the float zero point ``quants.float_zero`` derives from it
(ovpool.worker.graph.weights).

GGUF's Q4 blocks store elements 0..15 in low nibbles and 16..31 in high nibbles, so they are
repacked into OpenVINO's order. Pure numpy.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from ovpool.errors import UnsupportedModelError
from ovpool.worker.gguf.quants import Packed, pack_crumbs, pack_nibbles


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


def _f16(blocks: np.ndarray, start: int, rows: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, start:start + 2]).view(np.float16).reshape(rows, -1)


def _u4_from_split_nibbles(qs: np.ndarray, rows: int) -> np.ndarray:
    """GGUF's nibble layout → OpenVINO u4 bytes of q, straight from byte to byte.

    Each row of ``qs`` holds 2*n elements in n bytes: elements 0..n-1 in the low nibbles and
    n..2n-1 in the high nibbles (n = 16 for Q4_0/Q4_1 blocks, 32 for each Q4_K chunk). OpenVINO
    wants elements 2i, 2i+1 in byte i's low and high nibble (XOR 0x88 turns q into q - 8 in i4).
    """
    even, odd = qs[:, 0::2], qs[:, 1::2]
    low = (even & np.uint8(0x0F)) | (odd << np.uint8(4))
    high = (even >> np.uint8(4)) | (odd & np.uint8(0xF0))
    return np.concatenate([low, high], axis=1).reshape(rows, -1)


def _affine(codes: np.ndarray, element: str, cols: int, scale: np.ndarray, offset: np.ndarray,
            dtype) -> Packed:
    """W = scale * q + offset, ``codes`` = q (unsigned, in ``element``), one scale and offset per
    group: the file's formula, exact (module docstring)."""
    return Packed(codes, element, (codes.shape[0], cols), cols // scale.shape[1], scale.astype(dtype),
                  offset=offset.astype(np.float32))


def _q8_0(blocks, rows, cols) -> Packed:
    codes = np.ascontiguousarray(blocks[:, 2:]).view(np.int8).reshape(rows, cols)
    return Packed(codes, "i8", (rows, cols), 32, _f16(blocks, 0, rows))


def _q4_0(blocks, rows, cols) -> Packed:
    codes = _u4_from_split_nibbles(blocks[:, 2:], rows) ^ np.uint8(0x88)
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


def _q5_1(blocks, rows, cols) -> Packed:
    codes = _five_bit(blocks[:, 4:8], blocks[:, 8:]).reshape(rows, -1)
    return _affine(codes, "u8", cols, _f16(blocks, 0, rows), _f16(blocks, 2, rows), np.float16)


def _q4_1(blocks, rows, cols) -> Packed:
    d, m = _f16(blocks, 0, rows), _f16(blocks, 2, rows)
    codes = _u4_from_split_nibbles(blocks[:, 4:], rows)
    return _affine(codes, "u4", cols, d, m, np.float16)


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
    codes = _u4_from_split_nibbles(blocks[:, 16:].reshape(n * 4, 32), rows)
    scale = (d * sc).reshape(rows, -1)
    offset = -(dmin * mn).reshape(rows, -1)
    return _affine(codes, "u4", cols, scale, offset, np.float32)


def _q6_k(blocks, rows, cols) -> Packed:
    n = blocks.shape[0]
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(blocks, 208, n).astype(np.float32)
    lo = (ql.reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & np.uint8(15)
    hi = (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    q = (lo.reshape(n, 2, 4, 32) | (hi.reshape(n, 2, 4, 32) << np.uint8(4))).astype(np.int8) - np.int8(32)
    return Packed(q.reshape(rows, cols), "i8", (rows, cols), 16, (d * sc).reshape(rows, -1))


def _q5_k(blocks, rows, cols) -> Packed:
    """8 sub-blocks of 32: d*sc*q - dmin*m, q in 0..31 (Q4_K's nibbles and scales, plus a high bit
    per element in ``qh``): q as u8 with an exact offset."""
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0, n).astype(np.float32), _f16(blocks, 2, n).astype(np.float32)
    sc, mn = _k_scale_min(blocks[:, 4:16])
    qh, qs = blocks[:, 16:48], blocks[:, 48:]
    low = (qs.reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & np.uint8(15)
    high = (qh.reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & np.uint8(1)
    q = low.reshape(n, 8, 32) | (high << np.uint8(4))
    return _affine(q.reshape(rows, cols), "u8", cols, (d * sc).reshape(rows, -1),
                   -(dmin * mn).reshape(rows, -1), np.float32)


def _q3_k(blocks, rows, cols) -> Packed:
    """16 sub-blocks of 16: d*scale*q, q in -4..3 (2 low bits in ``qs``, the high bit in ``hmask``,
    set meaning no -4), 6-bit signed scales: q as i4, one f32 scale per 16 (d*scale needs more
    than f16's 11 bits)."""
    n = blocks.shape[0]
    hmask, qs, packed_scales = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108]
    d = _f16(blocks, 108, n).astype(np.float32)
    low = (qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    high = (hmask.reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & np.uint8(1)
    minus_four = ((high.reshape(n, 256) ^ np.uint8(1)) << np.uint8(2)).view(np.int8)
    q = low.reshape(n, 256).view(np.int8) - minus_four
    lo, hi = packed_scales[:, :8], packed_scales[:, 8:]
    sc_low = np.concatenate([lo & np.uint8(15), lo >> np.uint8(4)], axis=1)
    sc_high = (hi.reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)) & np.uint8(3)
    scale = (sc_low | (sc_high.reshape(n, 16) << np.uint8(4))).view(np.int8) - np.int8(32)
    codes = pack_nibbles(q.view(np.uint8).reshape(rows, cols) & np.uint8(15))
    return Packed(codes, "i4", (rows, cols), 16, (d * scale).reshape(rows, -1))


def _q2_k(blocks, rows, cols) -> Packed:
    """16 sub-blocks of 16: d*sc*q - dmin*m, q in 0..3, 4-bit sc and m: q as u2 (four to a byte,
    which the CPU plugin's compressed MatMul reads) with f32 scales and exact f32 offsets."""
    n = blocks.shape[0]
    packed_scales, qs = blocks[:, :16], blocks[:, 16:80]
    d, dmin = _f16(blocks, 80, n).astype(np.float32), _f16(blocks, 82, n).astype(np.float32)
    q = (qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    scale = (d * (packed_scales & np.uint8(15))).reshape(rows, -1)
    offset = -(dmin * (packed_scales >> np.uint8(4))).reshape(rows, -1)
    return _affine(pack_crumbs(q.reshape(rows, cols)), "u2", cols, scale, offset, np.float32)


IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
"""IQ4_NL/IQ4_XS's non-linear 4-bit codebook (llama.cpp's kvalues_iq4nl). Every value fits in i8,
so the codes become the values themselves: Q8_0's form, exact (a Gather of 4-bit codes into the
codebook is not fused by the CPU plugin: it would be folded into an f32 matrix at compile)."""


def _iq4_nl(blocks, rows, cols) -> Packed:
    qs = blocks[:, 2:]
    codes = IQ4_VALUES[np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=1)]
    return Packed(codes.reshape(rows, cols), "i8", (rows, cols), 32, _f16(blocks, 0, rows))


def _iq4_xs(blocks, rows, cols) -> Packed:
    """IQ4_NL's codebook in 256-blocks of 8 sub-blocks of 32, each scaled by d * (6-bit ls - 32)."""
    n = blocks.shape[0]
    d = _f16(blocks, 0, n).astype(np.float32)
    high = np.ascontiguousarray(blocks[:, 2:4]).view(np.uint16)
    high = (high >> np.arange(0, 16, 2, dtype=np.uint16)) & np.uint16(3)
    low = blocks[:, 4:8]
    ls = np.stack([low & np.uint8(15), low >> np.uint8(4)], axis=-1).reshape(n, 8)
    ls = ls | (high.astype(np.uint8) << np.uint8(4))
    qs = blocks[:, 8:].reshape(n, 8, 16)
    codes = IQ4_VALUES[np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=2)]
    scale = d * (ls.view(np.int8) - np.int8(32))
    return Packed(codes.reshape(rows, cols), "i8", (rows, cols), 32, scale.reshape(rows, -1))


_FLOATS = {T.F32: np.float32, T.F16: np.float16, T.BF16: np.uint16}
_FLOAT_NAMES = {T.F32: "f32", T.F16: "f16", T.BF16: "bf16"}
_UNPACKERS = {T.Q8_0: _q8_0, T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q4_K: _q4_k, T.Q6_K: _q6_k,
              T.Q5_0: _q5_0, T.Q5_1: _q5_1, T.Q5_K: _q5_k, T.Q3_K: _q3_k, T.Q2_K: _q2_k,
              T.IQ4_NL: _iq4_nl, T.IQ4_XS: _iq4_xs}
