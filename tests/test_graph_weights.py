"""OpenVINO compressed constants compute exactly what their Packed weights mean."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest
from gguf import GGMLQuantizationType as T
from test_gguf_quants import F16_FIELDS, random_blocks

from ovpool.worker.gguf.blocks import unpack
from ovpool.worker.gguf.quants import dequantize
from ovpool.worker.graph.weights import Encoding, Weight, rope_halves_order

ROWS, COLS = 48, 256


def run(build, x: np.ndarray) -> np.ndarray:
    param = ops.parameter(ov.PartialShape([-1, -1]) if x.dtype == np.int64 else [-1, -1, COLS],
                          ov.Type.i64 if x.dtype == np.int64 else ov.Type.f32, name="x")
    model = ov.Model([ops.result(build(param.output(0)))], [param])
    config = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
    return ov.Core().compile_model(model, "CPU", config)([x])[0]


@pytest.mark.parametrize("qtype", list(F16_FIELDS))
def test_linear_and_lookup_match_the_dequantized_matrix(qtype):
    packed = unpack(qtype, random_blocks(qtype, ROWS, COLS, seed=3), (ROWS, COLS))
    weight, dense = Weight(packed, "w"), dequantize(packed)
    x = np.random.default_rng(0).standard_normal((2, 5, COLS)).astype(np.float32)
    y = run(lambda x: weight.linear(x)[0], x)
    np.testing.assert_allclose(y, x @ dense.T, atol=1e-5 * np.abs(x @ dense.T).max())
    ids = np.array([[3, 0, 47], [5, 5, 1]], np.int64)
    np.testing.assert_allclose(run(weight.lookup, ids), dense[ids], atol=1e-6 * np.abs(dense).max())


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.Q6_K, T.Q4_1])
def test_a_spare_row_leaves_every_output_bit_as_it_was(qtype):
    """``one_layout`` (f32) adds a zero row to a weight of 96 rows (its 64-row blocks are padded
    anyway), so the CPU plugin keeps one layout of it instead of two; no output bit may move,
    for passes of one row, of 7-80 rows (where the plugin used its other layout) or more."""
    rows = 96
    packed = unpack(qtype, random_blocks(qtype, rows, COLS, seed=5), (rows, COLS))
    plain, spare = Weight(packed, "w"), Weight(packed, "w", one_layout=True)
    assert spare._spare_row(rows) and not plain._spare_row(rows)
    for n in (1, 8, 33, 100):
        x = np.random.default_rng(n).standard_normal((1, n, COLS)).astype(np.float32)
        for sizes in (None, [40, 56]):
            a, b = (run(lambda x, w=w, sizes=sizes: ops.concat(w.linear(x, sizes), -1), x)
                    for w in (plain, spare))
            assert a.shape == (1, n, rows)
            assert np.array_equal(a, b)


@pytest.mark.parametrize("rows,cols,spared", [(96, 256, True), (4096, 640, True), (64, 256, False),
                                              (1536, 640, False), (4096, 1024, False), (100, 256, False)])
def test_a_spare_row_only_where_its_padding_is_cheap(rows, cols, spared):
    # 4096 x 1024: 4 M elements, one layout already; 64 and 1536 rows: a whole 64-row block more.
    packed = unpack(T.Q8_0, random_blocks(T.Q8_0, 1, cols, seed=1), (1, cols))
    assert Weight(packed, "w", one_layout=True)._spare_row(rows) == spared
    assert not Weight(packed, "w")._spare_row(rows)


def test_only_f32_compute_spares_a_row():
    # bf16 or f16 compute (int8 activations, GPUs) lays each weight out once already.
    settings = dict(kquant_requant="none", q4_storage="i4", zero_points="float", activations="float")
    assert Encoding.of(type("S", (), {**settings, "inference_precision": "f32"})).one_layout
    assert not Encoding.of(type("S", (), {**settings, "inference_precision": "bf16"})).one_layout


def test_a_looked_up_weight_frees_its_codes_without_a_garbage_collection():
    """A built graph's Weights go as soon as the build is done: a tied vocabulary that kept
    itself alive (``_table = self``) held SmolLM2's 27 MiB of codes through the warm-up."""
    packed = unpack(T.Q8_0, random_blocks(T.Q8_0, ROWS, COLS, seed=1), (ROWS, COLS))
    weight = Weight(packed, "w")
    weight.lookup(ops.parameter([-1], ov.Type.i64).output(0))
    gone = weakref.ref(weight)
    gc.disable()
    try:
        del weight
        assert gone() is None
    finally:
        gc.enable()


def test_rope_halves_order_undoes_the_llama_converter_permutation():
    heads, head_dim = 3, 8
    hf_rows = np.arange(heads * head_dim)
    # llama.cpp's convert_hf_to_gguf.py permute(): HF rotate-half rows → GGUF interleaved rows.
    gguf_rows = hf_rows.reshape(heads, 2, head_dim // 2).swapaxes(1, 2).reshape(-1)
    np.testing.assert_array_equal(gguf_rows[rope_halves_order(len(hf_rows), head_dim)], hf_rows)
