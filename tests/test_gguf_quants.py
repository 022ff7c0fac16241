"""GGUF quant blocks unpack to codes + scales that mean exactly what gguf.quants dequantizes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as T

from ovpool.worker.gguf.blocks import unpack
from ovpool.worker.gguf.quants import (
    centered,
    concat_rows,
    dequantize,
    float_activations,
    float_zero,
    gatherable,
    group_sums,
    integer_zero,
    pack_crumbs,
    pack_nibbles,
    permute_rows,
    requantize,
    rounded_zero,
    unpack_crumbs,
    unpack_nibbles,
    widen,
)

# Byte offsets of the f16 scale fields inside one block of each type.
F16_FIELDS = {T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2], T.Q4_K: [0, 2], T.Q6_K: [208], T.Q5_0: [0],
              T.Q5_1: [0, 2], T.Q5_K: [0, 2], T.Q3_K: [108], T.Q2_K: [80, 82], T.IQ4_NL: [0],
              T.IQ4_XS: [0]}


def random_blocks(qtype: T, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random bytes for every field, with sane f16 scales (random bits could be inf/NaN)."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        values = rng.uniform(-0.05, 0.05, blocks.shape[0]).astype(np.float16)
        blocks[:, off:off + 2] = values.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


@pytest.mark.parametrize("qtype", list(F16_FIELDS))
def test_quantized_blocks_dequantize_like_gguf(qtype):
    rows, cols = 6, 512
    raw = random_blocks(qtype, rows, cols)
    packed = unpack(qtype, raw, (rows, cols))
    expected = quants.dequantize(raw.reshape(rows, -1), qtype)
    # Bit for bit: Q4_1/Q4_K/Q5_1/Q5_K/Q2_K keep the file's scale * q + offset, each exact in float32.
    np.testing.assert_array_equal(dequantize(packed), expected)
    # Their float zero point form (zero_points=float/integer) equals it up to float32 rounding.
    np.testing.assert_allclose(dequantize(float_zero(packed)), expected, atol=1e-6 * np.abs(expected).max())


@pytest.mark.parametrize("qtype,dtype", [(T.F32, np.float32), (T.F16, np.float16)])
def test_float_weights_are_views(qtype, dtype):
    values = np.arange(64, dtype=dtype).reshape(2, 32)
    raw = values.view(np.uint8).reshape(-1)
    packed = unpack(qtype, raw, (2, 32))
    assert np.shares_memory(packed.codes, raw)
    np.testing.assert_array_equal(dequantize(packed), values.astype(np.float32))


def test_bf16_dequantizes_like_gguf():
    raw = quants.quantize(np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32), T.BF16)
    packed = unpack(T.BF16, raw.reshape(-1), (2, 32))
    np.testing.assert_array_equal(dequantize(packed), quants.dequantize(raw, T.BF16))


def test_q4_1_keeps_its_minimum_exactly():
    # A block whose minimum is far from an integer multiple of its step: rounding it to a u4 zero
    # point would move every weight by ~half a step.
    x = (0.13 + 0.01 * (np.arange(32) % 16)).astype(np.float32).reshape(1, 32)
    raw = quants.quantize(x, T.Q4_1).reshape(-1)
    packed = unpack(T.Q4_1, raw, (1, 32))
    assert packed.zero is None and packed.offset[0, 0] == raw[2:4].view(np.float16)[0]
    zero = float_zero(packed).zero
    assert zero.dtype == np.float32 and zero[0, 0] != np.round(zero[0, 0])
    np.testing.assert_allclose(dequantize(packed), x, atol=1e-4)


def test_q4_1_block_with_zero_scale_is_its_minimum():
    # All weights equal: llama.cpp stores scale 0 and the value as the minimum, whatever the codes.
    raw = random_blocks(T.Q4_1, 2, 64).reshape(4, -1)
    raw[1, 0:4] = np.array([0, -0.75], np.float16).view(np.uint8)
    packed = float_zero(unpack(T.Q4_1, raw.reshape(-1), (2, 64)))
    expected = quants.dequantize(raw.reshape(2, -1), T.Q4_1)
    assert (expected[0, 32:] == np.float32(-0.75)).all()
    np.testing.assert_array_equal(dequantize(packed)[0, 32:], expected[0, 32:])
    np.testing.assert_allclose(dequantize(packed), expected, atol=1e-6 * np.abs(expected).max())


@pytest.mark.parametrize("qtype,element", [(T.Q4_1, "i4"), (T.Q4_K, "i4"), (T.Q5_1, "i8"),
                                           (T.Q5_K, "i8"), (T.Q2_K, "u2")])
def test_centered_codes_mean_the_same_weights(qtype, element):
    # zero_points=offset: signed codes with no zero point, the offset moved by center * scale.
    packed = unpack(qtype, random_blocks(qtype, 4, 512), (4, 512))
    moved = centered(packed)
    assert moved.element == element and moved.zero is None and moved.offset.dtype == np.float32
    exact = dequantize(packed)
    np.testing.assert_allclose(dequantize(moved), exact, rtol=0, atol=1e-6 * np.abs(exact).max())


def test_q4_0_needs_no_zero_point():
    packed = unpack(T.Q4_0, random_blocks(T.Q4_0, 2, 64), (2, 64))
    assert packed.element == "i4" and packed.zero is None


def test_nibble_packing_round_trips_in_openvino_order():
    q = np.arange(32, dtype=np.uint8).reshape(2, 16) % 16
    packed = pack_nibbles(q)
    assert packed[0, 0] == 0x10  # element 0 low, element 1 high
    np.testing.assert_array_equal(unpack_nibbles(packed, "u4"), q)


def test_crumb_packing_round_trips_in_openvino_order():
    q = np.arange(32, dtype=np.uint8).reshape(2, 16) % 4
    packed = pack_crumbs(q)
    assert packed.shape == (2, 4) and packed[0, 0] == 0b11100100  # element 0 in the lowest bits
    np.testing.assert_array_equal(unpack_crumbs(packed), q)


def test_q2_k_is_gathered_from_4_bit_codes_of_the_same_weights():
    packed = unpack(T.Q2_K, random_blocks(T.Q2_K, 4, 256), (4, 256))
    table = gatherable(packed)
    assert packed.element == "u2" and table.element == "u4" and table.codes.shape == (4, 128)
    np.testing.assert_array_equal(dequantize(table), dequantize(packed))
    q8 = unpack(T.Q8_0, random_blocks(T.Q8_0, 4, 256), (4, 256))
    assert gatherable(q8) is q8


def test_permute_rows_moves_every_per_row_array():
    raw = random_blocks(T.Q4_1, 4, 64)
    packed = unpack(T.Q4_1, raw, (4, 64))
    order = np.array([2, 0, 3, 1])
    np.testing.assert_array_equal(dequantize(permute_rows(packed, order)), dequantize(packed)[order])


@pytest.mark.parametrize("qtype,scheme,element,steps", [(T.Q4_K, "q8_sym32", "i8", 127),
                                                       (T.Q4_K, "q4_asym32", "u4", 15),
                                                       (T.Q6_K, "q4_asym32", "u4", 15)])
def test_requantized_k_quants_stay_within_a_rounding_step(qtype, scheme, element, steps):
    packed = unpack(qtype, random_blocks(qtype, 4, 256), (4, 256))
    exact = dequantize(packed)
    again = requantize(packed, scheme)
    assert again.element == element and again.group == 32
    assert again.zero is None or again.zero.dtype == np.uint8
    groups = exact.reshape(4, -1, 32)
    lo, hi = groups.min(-1, keepdims=True), groups.max(-1, keepdims=True)
    step = (np.maximum(-lo, hi) if element == "i8" else np.maximum(hi, 0) - np.minimum(lo, 0)) / steps
    err = np.abs(dequantize(again).reshape(4, -1, 32) - groups)
    # Half a step of rounding (a whole one where the rounded zero point clips the range), plus
    # the f16 rounding of the scale times the largest code.
    rounding = 0.5 if element == "i8" else 1.0
    assert (err <= step * (rounding + steps * 2.0**-11) + 1e-7).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_q6_k_in_8_bit_groups_of_32_keeps_each_coarser_half_exactly(seed):
    packed = unpack(T.Q6_K, random_blocks(T.Q6_K, 4, 512, seed=seed), (4, 512))
    exact = dequantize(packed).reshape(4, -1, 2, 16)
    again = requantize(packed, "q8_sym32")
    assert (again.element, again.group, again.scale.dtype) == ("i8", 32, np.float32)
    got = dequantize(again).reshape(exact.shape)
    coarser = np.abs(packed.scale.reshape(4, -1, 2)).argmax(-1)[..., None, None]
    # To float32 rounding: the scale is the coarser half's divided by m, times codes q * m.
    np.testing.assert_allclose(np.take_along_axis(got, coarser, 2), np.take_along_axis(exact, coarser, 2),
                               rtol=2**-22)
    scale = again.scale[..., None, None]
    assert (np.abs(got - exact) <= scale / 2 + 2**-21 * np.abs(exact)).all()  # the other half rounds
    # The codes span at least 3/4 of i8's range (a whole multiple of the coarser half's step).
    assert (scale <= np.abs(exact).max((-1, -2), keepdims=True) / 95 * (1 + 1e-6)).all()


@pytest.mark.parametrize("qtype,requant,element", [(T.Q4_0, None, "i8"), (T.Q4_1, None, "u8"),
                                                   (T.Q4_K, "q4_asym32", "u8"), (T.Q8_0, None, "i8")])
def test_widened_codes_mean_the_same_weights(qtype, requant, element):
    packed = unpack(qtype, random_blocks(qtype, 4, 256), (4, 256))
    packed = requantize(packed, requant) if requant else packed
    wide = widen(packed)
    assert wide.element == element and wide.codes.shape == (4, 256)
    np.testing.assert_array_equal(dequantize(wide), dequantize(packed))


@pytest.mark.parametrize("qtype,element", [(T.Q4_1, "u4"), (T.Q4_K, "u4"), (T.Q5_1, "u8"), (T.Q5_K, "u8"),
                                           (T.Q2_K, "u4")])
def test_integer_zero_points_keep_the_weights_with_their_remainder(qtype, element):
    packed = unpack(qtype, random_blocks(qtype, 4, 256, seed=5), (4, 256))
    rounded = integer_zero(packed)
    assert rounded.element == element and rounded.zero.dtype == np.uint8 and rounded.offset is not None
    exact = dequantize(packed)
    np.testing.assert_allclose(dequantize(rounded), exact, atol=1e-6 * np.abs(exact).max())
    assert integer_zero(unpack(T.Q4_0, random_blocks(T.Q4_0, 2, 64), (2, 64))).offset is None


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_0, T.Q6_K, T.Q2_K])
def test_float_activation_form_is_the_same_weights_with_a_float_zero_point(qtype):
    # The form the plugin's int8 path does not take (the head at activations=int8): exact.
    packed = unpack(qtype, random_blocks(qtype, 4, 256, seed=9), (4, 256))
    kept = float_activations(packed)
    assert kept.zero is not None and kept.zero.dtype == np.float32 and kept.offset is None
    exact = dequantize(packed)
    np.testing.assert_allclose(dequantize(kept), exact, atol=1e-6 * np.abs(exact).max())


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q5_1])
def test_group_sum_rows_under_a_weight_sum_each_column_group(qtype):
    rounded = integer_zero(unpack(qtype, random_blocks(qtype, 4, 256, seed=7), (4, 256)))
    stacked = concat_rows([rounded, group_sums(rounded)])
    x = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    # Without the offsets: the plain integer-coded weights, then one sum per 32-column group.
    plain = dequantize(replace(stacked, offset=None))
    np.testing.assert_allclose(plain[:4], dequantize(replace(rounded, offset=None)))
    np.testing.assert_allclose(plain[4:] @ x, x.reshape(8, 32).sum(1), rtol=1e-5)


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q4_K])
def test_rounded_zero_points_drop_the_remainder(qtype):
    packed = unpack(qtype, random_blocks(qtype, 4, 256, seed=3), (4, 256))
    rounded, kept = rounded_zero(packed), integer_zero(packed)
    assert rounded.offset is None and rounded.zero.dtype == np.uint8
    moved = (dequantize(rounded) - dequantize(packed)).reshape(4, -1, packed.group)
    np.testing.assert_allclose(moved, np.broadcast_to(-kept.offset[..., None], moved.shape), atol=1e-5)
    # Half a step at most, where the zero point lies inside the codes' range (else it is clipped).
    inside = (kept.zero > 0) & (kept.zero < 15)
    assert (np.abs(kept.offset) <= np.abs(packed.scale) / 2 * (1 + 1e-5))[inside].all() and inside.any()
