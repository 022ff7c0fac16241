"""Small, correct Q4_K and Q6_K quantizers (gguf.quants only dequantizes K-quants).

Simple min/max scale search rather than llama.cpp's iterative refinement: the blocks are valid and
dequantize (with gguf.quants) to within each format's step size, which is all fixtures need.
Both take float32 rows whose length is a multiple of 256 and return uint8 [rows, bytes per row].
"""

from __future__ import annotations

import numpy as np
from gguf import QK_K


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.zeros(np.broadcast_shapes(num.shape, den.shape), np.float32),
                     where=den != 0)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """Block of 256 = 8 sub-blocks of 32; x = d*sc[j]*q - dmin*m[j], 6-bit sc/m, 4-bit q."""
    blocks = rows.astype(np.float32).reshape(-1, 8, 32)
    lo = np.minimum(blocks.min(axis=-1), 0)             # a sub-block's offset is never positive
    scale = (blocks.max(axis=-1) - lo) / 15
    offset = -lo
    d = (scale.max(axis=-1, keepdims=True) / 63).astype(np.float16).astype(np.float32)
    dmin = (offset.max(axis=-1, keepdims=True) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(_safe_div(scale, d)), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(_safe_div(offset, dmin)), 0, 63).astype(np.uint8)
    step = (d * sc)[..., None]
    q = np.rint(_safe_div(blocks + (dmin * mn)[..., None], step))
    q = np.clip(q, 0, 15).astype(np.uint8)                                   # [n, 8, 32]
    packed = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)         # low nibble: even j
    out = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_q4_k_scales(sc, mn), packed], axis=1)
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


QUANTIZERS = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k}
BLOCK = QK_K
