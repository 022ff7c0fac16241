"""Packed weights: integer codes + per-group scales, and what can be done to one without
expanding it to float (dequantize for tests and the reference, permute, stack, requantize, widen).

A ``Packed`` weight of shape [rows, cols] means, for column c in group g = c // group::

    W[r, c] = scale[r, g] * (code[r, c] - zero[r, g]) + offset[r, g]

``zero`` and ``offset`` may be absent (zero). The codes, scales and zero points are what OpenVINO's
CPU plugin fuses into its MatMul and Gather kernels (Convert codes, [Subtract zero point], Multiply
scale); an offset adds ``groupsum(x) @ offset.T`` beside the MatMul (ovpool.worker.graph.weights, with
``group_sums``):
``integer_zero`` makes one where the plugin's int8 kernels need an integer zero point.
u4/i4 codes are stored packed as OpenVINO expects: element 2i in the low nibble of byte i; u2
codes four to a byte, element 4i + k in bits 2k, 2k + 1. ovpool.worker.gguf.blocks makes Packed
weights from GGUF's blocks; the OpenVINO side lives in ovpool.worker.graph.weights.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class Packed:
    codes: np.ndarray  # [rows, cols] (u4/i4: [rows, cols // 2] packed bytes; u2: [rows, cols // 4])
    element: str  # "f32", "f16", "bf16", "i8", "u8", "u4", "i4", "u2"
    shape: tuple[int, int]
    group: int = 0
    scale: np.ndarray | None = None  # [rows, groups] float16 or float32
    zero: np.ndarray | None = None  # [rows, groups] uint8 (u4 zero point) or float32 (exact)
    offset: np.ndarray | None = None  # [rows, groups] float32: the remainder of a rounded zero point


def dequantize(p: Packed) -> np.ndarray:
    """The float32 matrix ``p`` stands for (tests and the reference use it)."""
    if p.group == 0:
        codes = p.codes.view(np.int16) if p.element == "bf16" else p.codes
        return (codes.astype(np.int32) << 16).view(np.float32) if p.element == "bf16" \
            else codes.astype(np.float32)
    rows, cols = p.shape
    q = unpack_nibbles(p.codes, p.element) if p.element in ("u4", "i4") else \
        unpack_crumbs(p.codes) if p.element == "u2" else p.codes
    q = q.reshape(rows, cols // p.group, p.group).astype(np.float32)
    if p.zero is not None:
        q = q - p.zero[..., None]
    w = q * p.scale.astype(np.float32)[..., None]
    return (w if p.offset is None else w + p.offset[..., None]).reshape(rows, cols)


def permute_rows(p: Packed, order: np.ndarray) -> Packed:
    """``p`` with its rows in ``order`` (a copy of each per-row array)."""
    pick = lambda a: None if a is None else np.ascontiguousarray(a[order])  # noqa: E731
    return replace(p, codes=pick(p.codes), scale=pick(p.scale), zero=pick(p.zero), offset=pick(p.offset))


def concat_rows(parts: list[Packed]) -> Packed | None:
    """One Packed with the rows of ``parts`` stacked (one MatMul instead of several), or None
    when their encodings differ."""
    first = parts[0]
    # Scales of different float types stack as float32 (exact); zero points must agree in kind.
    same = all(p.element == first.element and p.group == first.group and p.shape[1] == first.shape[1]
               and (p.scale is None) == (first.scale is None)
               and (p.zero is None) == (first.zero is None)
               and (p.zero is None or p.zero.dtype == first.zero.dtype)
               and (p.offset is None) == (first.offset is None) for p in parts)
    if not same:
        return None
    cat = lambda arrays: None if arrays[0] is None else np.concatenate(arrays)  # noqa: E731
    rows = sum(p.shape[0] for p in parts)
    return Packed(cat([p.codes for p in parts]), first.element, (rows, first.shape[1]), first.group,
                  cat([p.scale for p in parts]), cat([p.zero for p in parts]), cat([p.offset for p in parts]))


def zero_row(p: Packed) -> Packed:
    """One row of zeros in ``p``'s encoding (codes, scale, zero point and offset 0), to stack
    under it (``concat_rows``)."""
    row = lambda a: None if a is None else np.zeros((1, *a.shape[1:]), a.dtype)  # noqa: E731
    return Packed(row(p.codes), p.element, (1, p.shape[1]), p.group, row(p.scale), row(p.zero),
                  row(p.offset))


def group_sums(p: Packed) -> Packed:
    """Rows in ``p``'s integer encoding (u4/u8 codes with integer zero points, as ``integer_zero``
    makes them) that sum a vector over each of ``p``'s column groups: row g has code 1 on group g's
    columns and 0 elsewhere, zero point 0, scale 1. Stacked under ``p`` (``concat_rows``), one MatMul
    gives both ``x @ W.T`` and the group sums an offset needs."""
    groups = p.shape[1] // p.group
    ones = np.repeat(np.eye(groups, dtype=np.uint8), p.group, axis=1)
    return Packed(pack_nibbles(ones) if p.element == "u4" else ones, p.element, (groups, p.shape[1]),
                  p.group, np.ones((groups, groups), p.scale.dtype), np.zeros((groups, groups), np.uint8),
                  np.zeros((groups, groups), np.float32))


def requantize(p: Packed, scheme: str) -> Packed:
    """A K-quant weight re-encoded (lossy) in a scheme with 32-element groups: ``q8_sym32`` (i8,
    symmetric) or ``q4_asym32`` (u4 with a u4 zero point, GenAI's form, no correction term).
    The float rows exist only transiently, one tensor at a time."""
    rows, cols = p.shape
    w = dequantize(p).reshape(rows, cols // 32, 32)
    lo, hi = w.min(-1), w.max(-1)
    if scheme == "q8_sym32" and p.group == 16 and p.element == "i8" and p.zero is None:
        return _q8_from_halves(p, w, lo, hi)
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


def _q8_from_halves(p: Packed, w: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Packed:
    """Symmetric 8-bit codes over 16-weight groups (Q6_K: codes -32..31, a scale per 16) joined
    in pairs: each 32-group's scale is its coarser half's divided by the largest whole m that
    keeps every code within i8 (m = 4 where a code -32 sets the range), so that half keeps its
    weights (codes q * m, f32 scales: to float32 rounding) and only the other half rounds: a
    smaller error than the range / 127 scale (docs/performance.md, quants.py)."""
    rows, cols = p.shape
    coarse = np.abs(p.scale.astype(np.float32).reshape(rows, cols // 32, 2)).max(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        fits = np.minimum(128 * coarse / -np.minimum(lo, 0), 127 * coarse / np.maximum(hi, 0))
    m = np.where(np.isfinite(fits), np.floor(fits * (1 + 1e-6)), 1).clip(1, 128)
    scale = (coarse / m).astype(np.float32)
    q = np.rint(_safe_div(w, scale)).clip(-128, 127).astype(np.int8)
    return Packed(q.reshape(rows, cols), "i8", p.shape, 32, scale)


def _safe_div(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    s = scale.astype(np.float32)[..., None]
    return np.where(s == 0, 0, x / np.where(s == 0, 1, s))


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """u8 values < 16, [rows, cols] → OpenVINO u4 bytes [rows, cols // 2]."""
    return q[:, 0::2] | (q[:, 1::2] << np.uint8(4))


def pack_crumbs(q: np.ndarray) -> np.ndarray:
    """u8 values < 4, [rows, cols] → OpenVINO u2 bytes [rows, cols // 4]: element 4i + k in bits
    2k, 2k + 1 of byte i."""
    shifts = np.array([0, 2, 4, 6], np.uint8)
    return np.bitwise_or.reduce(q.reshape(q.shape[0], -1, 4) << shifts, axis=2)


def unpack_crumbs(packed: np.ndarray) -> np.ndarray:
    shifts = np.array([0, 2, 4, 6], np.uint8)
    return ((packed[..., None] >> shifts) & np.uint8(3)).reshape(packed.shape[0], -1)


def unpack_nibbles(packed: np.ndarray, element: str) -> np.ndarray:
    lo, hi = packed & np.uint8(15), packed >> np.uint8(4)
    q = np.stack([lo, hi], axis=-1).reshape(packed.shape[0], -1)
    return (q.astype(np.int8) ^ 8) - 8 if element == "i4" else q


def widen(p: Packed) -> Packed:
    """``p`` with each 4-bit code in a byte of its own (i4 → i8, u4 → u8): the same values, scales
    and zero points. OpenVINO's CPU plugin repacks 4-bit weights for its kernels with a reference
    (non-JIT) reorder at the first inference of each kernel layout, 8-bit ones with a JIT one, so
    the set-up is faster (docs/performance.md, quants.py)."""
    if p.element not in ("i4", "u4"):
        return p
    return replace(p, codes=unpack_nibbles(p.codes, p.element), element=p.element.replace("4", "8"))


def gatherable(p: Packed) -> Packed:
    """``p`` with u2 codes held as u4 (the same values): the CPU plugin gathers rows of compressed
    8- and 4-bit tables but folds a u2 table into f32 at compile (a 262k-row vocabulary: 4 bytes a
    weight), and its int8 path reads no u2 (see integer_zero). Other encodings are returned as
    they are."""
    if p.element != "u2":
        return p
    return replace(p, codes=pack_nibbles(unpack_crumbs(p.codes)), element="u4")


# The codes' midpoint in the float zero point form: u4 q → i4 q - 8; Q5's u8 q (0..31) → i8 q - 16.
_CENTER = {"u4": 8, "u8": 16, "u2": 0}


def float_zero(p: Packed) -> Packed:
    """``p`` in its exact offset form (W = scale * q + offset, as ovpool.worker.gguf.blocks reads
    Q4_1, Q4_K, Q5_1, Q5_K, Q2_K) as signed codes c = q - center with a float32 zero point,
    -(center + offset / scale): one Subtract per weight, which the CPU plugin fuses into its kernels,
    exact to float32 rounding. A group whose scale is 0 gets codes 0, scale 1 and zero point
    -offset. Any other Packed is returned as it is."""
    if p.offset is None or p.zero is not None:
        return p
    center = _CENTER[p.element]
    scale64, offset64 = p.scale.astype(np.float64), p.offset.astype(np.float64)
    flat = scale64 == 0
    zero = np.where(flat, -offset64, -center - offset64 / np.where(flat, 1, scale64))
    codes = _signed(p)
    if flat.any():  # W = offset whatever the code
        codes = codes.reshape(*p.scale.shape, -1).copy()
        codes[flat] = 0
        codes = codes.reshape(p.shape[0], -1)
    return Packed(codes, p.element if center == 0 else "i" + p.element[1:], p.shape, p.group,
                  np.where(flat, 1, p.scale).astype(p.scale.dtype), zero.astype(np.float32))


def centered(p: Packed) -> Packed:
    """``p`` in its exact offset form with signed codes c = q - center and the offset moved by
    center * scale (computed in float64, rounded once to float32): the same weights, but the
    MatMul's terms x * scale * c and the offsets' share are no longer both large and of opposite
    sign, which lost precision in float32 (docs/performance.md, "Cost against model size").
    Q2_K's u2 codes (no signed 2-bit type) stay as they are; any other Packed is returned as it is."""
    if p.offset is None or p.zero is not None or _CENTER[p.element] == 0:
        return p
    center = _CENTER[p.element]
    offset = p.offset.astype(np.float64) + center * p.scale.astype(np.float64)
    return replace(p, codes=_signed(p), element="i" + p.element[1:], offset=offset.astype(np.float32))


def _signed(p: Packed) -> np.ndarray:
    """``p``'s unsigned codes q as q - center: i4 bytes (XOR 0x88), i8, or u2 as they are."""
    if p.element == "u4":
        return p.codes ^ np.uint8(0x88)
    return p.codes.view(np.int8) - np.int8(_CENTER["u8"]) if p.element == "u8" else p.codes


def integer_zero(p: Packed) -> Packed:
    """``p`` with its float zero point (``float_zero`` of an exact block minimum: Q4_1, Q4_K, Q5_1,
    Q5_K, Q2_K) rounded to an integer one, and the remainder kept as ``offset``: scale * (code -
    round(z)) + scale * (round(z) - z) is the same weight, to float32 rounding. The codes become
    unsigned (i4 + 8 → u4, i8 + 128 → u8, u2 → u4), as the CPU plugin's int8 path wants them: it
    quantizes activations to int8 (dynamic quantization, on VNNI and AMX CPUs at bf16) only for
    u8/u4 weights with integer zero points, and that path gives each row of a pass the same result
    whatever the other rows are (ovpool.worker.graph.cpu_class). Q2_K pays for it with twice its
    code bytes."""
    p = float_zero(p)
    if p.zero is None or p.zero.dtype == np.uint8:
        return p
    p = gatherable(p)  # u2 → u4: the int8 path takes no u2 (the crumb form fails to compile there)
    shift = {"i4": 8, "i8": 128, "u4": 0}[p.element]
    zero = p.zero.astype(np.float64) + shift
    rounded = np.clip(np.rint(zero), 0, 15 if p.element[1:] == "4" else 255)
    offset = (p.scale.astype(np.float64) * (rounded - zero)).astype(np.float32)
    codes = p.codes.view(np.uint8) ^ np.uint8({8: 0x88, 128: 0x80, 0: 0}[shift])
    return replace(p, codes=codes, element="u" + p.element[1:], zero=rounded.astype(np.uint8), offset=offset)


def float_activations(p: Packed) -> Packed:
    """``p`` in a form the CPU plugin's int8 path does not take (it takes u8/u4 codes with an
    integer zero point or none, i8/i4 codes with none), so the MatMul keeps f32 activations: a
    float zero point, ``float_zero``'s for an exact block minimum, for symmetric codes (Q8_0,
    Q4_0, ...) the codes made unsigned with a float zero point of 128 or 8 (one, broadcast): the
    same weights, exactly."""
    p = float_zero(p)
    if p.group == 0 or p.zero is not None:
        return p if p.zero is None or p.zero.dtype != np.uint8 else replace(p, zero=p.zero.astype(np.float32))
    shift = {"i4": 8, "i8": 128}.get(p.element)
    if shift is None:
        return p
    codes = p.codes.view(np.uint8) ^ np.uint8(0x88 if shift == 8 else 0x80)
    return replace(p, codes=codes, element="u" + p.element[1:], zero=np.full((1, 1), shift, np.float32))


def rounded_zero(p: Packed) -> Packed:
    """``p`` with its float zero point rounded to an integer one and the remainder dropped, as
    OpenVINO GenAI reads Q4_1: each weight moves by up to half a scale step (``integer_zero``
    keeps that as its offset). The int8 path then runs the MatMul alone, with no offset term:
    faster, and less exact (opt-in; docs/performance.md, quants.py)."""
    return replace(integer_zero(p), offset=None)
