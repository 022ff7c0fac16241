"""The tiny-GGUF generator: files load with gguf.GGUFReader and hold what was written."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from ovpool.testing.tiny import WEIGHT_TYPES, TinySpec
from ovpool.testing.tiny_vocab import SPECIAL_TOKENS

# Largest |dequantized - written| allowed, as a fraction of the largest |weight| in its block (one
# element for float types): half a quantization step, a whole one for Q4_0/Q3_K (their grids are
# -8..7 and -4..3, so the side opposite the extreme clips), a little more for K-quants (they round
# sub-block scales); IQ4's codebook values are at most 24/127 apart and stop at 113/127.
TOLERANCE = {"F32": 0.0, "F16": 1e-3, "BF16": 8e-3, "Q8_0": 5e-3, "Q4_0": 0.126, "Q4_1": 0.067,
             "Q4_K": 0.1, "Q6_K": 0.025, "Q5_0": 0.063, "Q5_1": 0.033, "Q5_K": 0.05, "Q3_K": 0.26,
             "Q2_K": 0.35, "IQ4_NL": 0.115, "IQ4_XS": 0.12}


def _max_block_error(got: np.ndarray, expected: np.ndarray, weight_type: str) -> float:
    """max over blocks of |error| / max |weight|, blocks as the format groups them (F16's
    subnormals below 6e-5 have coarser relative precision, hence the floor)."""
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[weight_type]][0]
    err = np.abs(got - expected).reshape(-1, block).max(axis=1)
    scale = np.abs(expected).reshape(-1, block).max(axis=1)
    return float(np.max(err / np.maximum(scale, 1e-4)))


def _fields(reader: gguf.GGUFReader) -> dict:
    return {name: field.contents() for name, field in reader.fields.items()}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
def test_weights_dequantize_to_what_was_written(tiny_model, arch, weight_type):
    spec = TinySpec(arch=arch, weight_type=weight_type, tied=False)
    reader = gguf.GGUFReader(tiny_model(arch, weight_type, tied=False))
    written = spec.weights()
    assert {t.name for t in reader.tensors} == set(written)
    for tensor in reader.tensors:
        expected = written[tensor.name]
        is_matmul = expected.ndim == 2
        assert tensor.tensor_type.name == (weight_type if is_matmul else "F32"), tensor.name
        got = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(expected.shape)
        if is_matmul:
            assert _max_block_error(got, expected, weight_type) <= TOLERANCE[weight_type], tensor.name
        else:
            np.testing.assert_array_equal(got, expected, err_msg=tensor.name)


@pytest.mark.parametrize("arch,pre", [("llama", "default"), ("qwen2", "qwen2")])
def test_metadata_has_hparams_and_tokenizer(tiny_model, arch, pre):
    spec = TinySpec(arch=arch)
    meta = _fields(gguf.GGUFReader(tiny_model(arch)))
    assert meta["general.architecture"] == arch
    expected = {"context_length": spec.context_length, "embedding_length": spec.n_embd,
                "block_count": spec.n_layers, "feed_forward_length": spec.n_ff,
                "attention.head_count": spec.n_heads, "attention.head_count_kv": spec.n_kv_heads,
                "rope.dimension_count": spec.n_embd // spec.n_heads, "vocab_size": len(spec.tokens)}
    for key, value in expected.items():
        assert meta[f"{arch}.{key}"] == value, key
    assert meta[f"{arch}.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    tokens = meta["tokenizer.ggml.tokens"]
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == pre
    assert len(tokens) == len(set(tokens)) == len(meta["tokenizer.ggml.token_type"])
    assert len(meta["tokenizer.ggml.merges"]) >= 200
    assert tokens[meta["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"
    assert all(tokens.index(t) >= 0 for t in SPECIAL_TOKENS)
    assert "<|im_start|>" in meta["tokenizer.chat_template"]


def test_tied_model_has_no_output_weight(tiny_model):
    names = {t.name for t in gguf.GGUFReader(tiny_model(tied=True)).tensors}
    assert "output.weight" not in names and "token_embd.weight" in names


def test_qwen2_has_qkv_biases_and_llama_does_not(tiny_model):
    qwen = {t.name for t in gguf.GGUFReader(tiny_model("qwen2")).tensors}
    llama = {t.name for t in gguf.GGUFReader(tiny_model("llama")).tensors}
    assert {"blk.0.attn_q.bias", "blk.1.attn_v.bias"} <= qwen
    assert not any(n.endswith(".bias") for n in llama)


def test_same_seed_same_file_and_other_seed_differs(tmp_path):
    a = TinySpec(seed=3).write(tmp_path / "a.gguf").read_bytes()
    b = TinySpec(seed=3).write(tmp_path / "b.gguf").read_bytes()
    c = TinySpec(seed=4).write(tmp_path / "c.gguf").read_bytes()
    assert a == b and a != c


def test_logits_of_float_weights_are_well_conditioned():
    # One normalized hidden state through the tied vocabulary projection: a few units of spread.
    w = TinySpec(weight_type="F32").weights()
    hidden = np.random.default_rng(0).standard_normal(w["token_embd.weight"].shape[1])
    hidden /= np.sqrt(np.mean(hidden ** 2))
    logits = w["token_embd.weight"] @ (hidden * w["output_norm.weight"])
    assert 0.5 < logits.std() < 5


def test_bad_spec_is_rejected():
    with pytest.raises(ValueError, match="weight_type"):
        TinySpec(weight_type="IQ2_XXS")
