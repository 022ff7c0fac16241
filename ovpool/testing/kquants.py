"""Small, correct quantizers for the K-quants and IQ4 types (gguf.quants only dequantizes them).

Simple min/max scale search rather than llama.cpp's iterative refinement: the blocks are valid and
dequantize (with gguf.quants) to within each format's step size, which is all fixtures need.
Each takes float32 rows whose length is a multiple of its block (256; IQ4_NL 32) and returns uint8
[rows, bytes per row].
"""

from __future__ import annotations

import numpy as np
from gguf import QK_K
from gguf.quants import IQ4_NL

# The codebook from the reference (not from ovpool.worker.gguf.quants, which the fixtures test).
IQ4_VALUES = np.array(IQ4_NL.kvalues, np.float32)


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.zeros(np.broadcast_shapes(num.shape, den.shape), np.float32),
                     where=den != 0)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _affine_levels(blocks: np.ndarray, levels: int, bits: int):
    """x = d*sc[j]*q - dmin*m[j] for sub-blocks j of ``blocks`` [n, subs, size]: (d, dmin, sc, m, q)
    with sc and m integers below 2**bits and q in 0..levels."""
    lo = np.minimum(blocks.min(axis=-1), 0)             # a sub-block's offset is never positive
    scale, offset, top = (blocks.max(axis=-1) - lo) / levels, -lo, 2 ** bits - 1
    d = (scale.max(axis=-1, keepdims=True) / top).astype(np.float16).astype(np.float32)
    dmin = (offset.max(axis=-1, keepdims=True) / top).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(_safe_div(scale, d)), 0, top).astype(np.uint8)
    mn = np.clip(np.rint(_safe_div(offset, dmin)), 0, top).astype(np.uint8)
    q = np.rint(_safe_div(blocks + (dmin * mn)[..., None], (d * sc)[..., None]))
    return d, dmin, sc, mn, np.clip(q, 0, levels).astype(np.uint8)


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """Block of 256 = 8 sub-blocks of 32; x = d*sc[j]*q - dmin*m[j], 6-bit sc/m, 4-bit q."""
    d, dmin, sc, mn, q = _affine_levels(rows.astype(np.float32).reshape(-1, 8, 32), 15, 6)
    packed = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)         # low nibble: even j
    out = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_q4_k_scales(sc, mn), packed], axis=1)
    return out.reshape(rows.shape[0], -1)


def quantize_q5_k(rows: np.ndarray) -> np.ndarray:
    """Q4_K with 5-bit q: the low nibbles as Q4_K's, bit 4 of element l of sub-block j in bit j of
    byte l of ``qh``."""
    d, dmin, sc, mn, q = _affine_levels(rows.astype(np.float32).reshape(-1, 8, 32), 31, 6)
    low = q & 0x0F
    qs = (low[:, 0::2, :] | (low[:, 1::2, :] << 4)).reshape(-1, 128)
    qh = ((q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    out = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_q4_k_scales(sc, mn), qh, qs], axis=1)
    return out.reshape(rows.shape[0], -1)


def quantize_q2_k(rows: np.ndarray) -> np.ndarray:
    """Block of 256 = 16 sub-blocks of 16; x = d*sc[j]*q - dmin*m[j], 4-bit sc/m (one byte per
    sub-block), 2-bit q: element 32*s + l of each 128-half in bits 2s of byte l."""
    d, dmin, sc, mn, q = _affine_levels(rows.astype(np.float32).reshape(-1, 16, 16), 3, 4)
    out = np.concatenate([sc | (mn << 4), _crumbs(q), _f16_bytes(d), _f16_bytes(dmin)], axis=1)
    return out.reshape(rows.shape[0], -1)


def _crumbs(q: np.ndarray) -> np.ndarray:
    """2-bit values [n, 256] → 64 bytes: element 128*h + 32*s + l in bits 2s of byte 32*h + l."""
    shifted = q.reshape(-1, 2, 4, 32) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    return shifted.sum(axis=2, dtype=np.uint8).reshape(-1, 64)


def quantize_q3_k(rows: np.ndarray) -> np.ndarray:
    """Block of 256 = 16 sub-blocks of 16; x = d*s[j]*q, 6-bit signed s, q in -4..3 stored as
    q + 4: 2 low bits as Q2_K's, the third bit of element 32*b + l in bit b of ``hmask`` byte l."""
    blocks = rows.astype(np.float32).reshape(-1, 16, 16)
    sub = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=-1)[..., None], -1)[..., 0] / -4
    d = (np.abs(sub).max(axis=-1, keepdims=True) / 31).astype(np.float16).astype(np.float32)
    s = np.clip(np.rint(_safe_div(sub, d)), -32, 31)
    q = (np.clip(np.rint(_safe_div(blocks, (d * s)[..., None])), -4, 3) + 4).astype(np.uint8)
    flat = q.reshape(-1, 8, 32)
    hmask = ((flat >> 2) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    u = (s + 32).astype(np.uint8)
    low = (u[:, :8] & 0x0F) | ((u[:, 8:] & 0x0F) << 4)
    high = ((u >> 4).reshape(-1, 4, 4) << (2 * np.arange(4, dtype=np.uint8))[None, :, None])
    high = high.sum(axis=1, dtype=np.uint8)
    out = np.concatenate([hmask, _crumbs(q & 3), low, high, _f16_bytes(d)], axis=1)
    return out.reshape(rows.shape[0], -1)


def _iq4_codes(x: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The index of the codebook value nearest each x / step."""
    return np.abs(_safe_div(x, step)[..., None] - IQ4_VALUES).argmin(-1).astype(np.uint8)


def _iq4_scale(blocks: np.ndarray) -> np.ndarray:
    """Each sub-block's step: its largest-magnitude value onto the codebook's -127."""
    return np.take_along_axis(blocks, np.abs(blocks).argmax(axis=-1)[..., None], -1)[..., 0] / -127


def quantize_iq4_nl(rows: np.ndarray) -> np.ndarray:
    """Block of 32: x = d * codebook[q]; element l in the low nibble of byte l, l + 16 in its high."""
    blocks = rows.astype(np.float32).reshape(-1, 32)
    d = _iq4_scale(blocks).astype(np.float16).astype(np.float32)
    q = _iq4_codes(blocks, d[:, None])
    out = np.concatenate([_f16_bytes(d), q[:, :16] | (q[:, 16:] << 4)], axis=1)
    return out.reshape(rows.shape[0], -1)


def quantize_iq4_xs(rows: np.ndarray) -> np.ndarray:
    """Block of 256 = 8 sub-blocks of 32 of IQ4_NL codes, each scaled by d * (ls - 32), ls 6-bit:
    low nibbles two to a byte, the high 2 bits of sub-block j in bits 2j of a u16."""
    blocks = rows.astype(np.float32).reshape(-1, 8, 32)
    sub = _iq4_scale(blocks)
    d = (np.abs(sub).max(axis=-1, keepdims=True) / 31).astype(np.float16).astype(np.float32)
    ls = np.clip(np.rint(_safe_div(sub, d)), -32, 31)
    q = _iq4_codes(blocks, (d * ls)[..., None])
    u = (ls + 32).astype(np.uint16)
    high = (((u >> 4) & 3) << (2 * np.arange(8, dtype=np.uint16))).sum(axis=1, dtype=np.uint16)
    low = (u[:, 0::2] & 0x0F) | ((u[:, 1::2] & 0x0F) << 4)
    qs = (q[..., :16] | (q[..., 16:] << 4)).reshape(-1, 128)
    high = high.reshape(-1, 1).view(np.uint8)
    out = np.concatenate([_f16_bytes(d), high, low.astype(np.uint8), qs], axis=1)
    return out.reshape(rows.shape[0], -1)


def _pack_q4_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """12 bytes: j<4 in the low 6 bits of bytes 0-3 / 4-7; j>=4 split into nibbles + top bits."""
    first = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    second = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    third = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return np.concatenate([first, second, third], axis=1).astype(np.uint8)


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """Block of 256 = 16 sub-blocks of 16; x = d*scale[j]*(q-32), int8 scales, 6-bit q."""
    blocks = rows.astype(np.float32).reshape(-1, 16, 16)
    sub = np.abs(blocks).max(axis=-1) / 31
    d = (sub.max(axis=-1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    scales = np.clip(np.rint(_safe_div(sub, d)), 0, 127).astype(np.int8)
    step = (d * scales)[..., None]
    q = (np.clip(np.rint(_safe_div(blocks, step)), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(-1, 2, 4, 32)                       # [n, half, quarter, 32]
    low, high = q & 0x0F, q >> 4
    ql = (low[:, :, 0:2, :] | (low[:, :, 2:4, :] << 4)).reshape(-1, 128)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6))
    out = np.concatenate([ql, qh.reshape(-1, 64), scales.view(np.uint8), _f16_bytes(d)], axis=1)
    return out.reshape(rows.shape[0], -1)


QUANTIZERS = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k, "Q5_K": quantize_q5_k, "Q3_K": quantize_q3_k,
              "Q2_K": quantize_q2_k, "IQ4_NL": quantize_iq4_nl, "IQ4_XS": quantize_iq4_xs}
BLOCK = QK_K
