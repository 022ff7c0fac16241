"""GGUFModel: hyper-parameters from metadata, validation errors that name the GGUF key."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFWriter

from ovpool.errors import ModelFormatError, ModelNotFoundError, UnsupportedModelError
from ovpool.worker.gguf.model import GGUFModel, resolve_model_path

DIMS = {"embedding_length": 64, "attention.head_count": 4, "attention.head_count_kv": 2,
        "feed_forward_length": 96, "block_count": 2, "context_length": 128}


def _tensors(arch, vocab=40, tied=False):
    e, q, kv, ff = 64, 64, 32, 96
    shapes = {"token_embd.weight": (vocab, e), "output_norm.weight": (e,)}
    if not tied:
        shapes["output.weight"] = (vocab, e)
    for i in range(2):
        b = f"blk.{i}."
        shapes |= {b + "attn_norm.weight": (e,), b + "ffn_norm.weight": (e,),
                   b + "attn_q.weight": (q, e), b + "attn_k.weight": (kv, e),
                   b + "attn_v.weight": (kv, e), b + "attn_output.weight": (e, q),
                   b + "ffn_gate.weight": (ff, e), b + "ffn_up.weight": (ff, e),
                   b + "ffn_down.weight": (e, ff)}
        if arch == "qwen2":
            shapes |= {b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)}
    return shapes


def write_model(path, arch="llama", drop=(), override=None, tied=False, tensors=None):
    w = GGUFWriter(str(path), arch)
    fields = {**DIMS, "attention.layer_norm_rms_epsilon": 1e-5, "rope.freq_base": 10000.0,
              **(override or {})}
    for key, value in fields.items():
        if key in drop:
            continue
        if isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        elif isinstance(value, str):
            w.add_string(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(40)])
    for name, shape in (tensors or _tensors(arch, tied=tied)).items():
        if name not in drop:
            w.add_tensor(name, np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("tied", [False, True])
def test_hparams_from_metadata(tmp_path, arch, tied):
    m = GGUFModel.open(write_model(tmp_path / "m.gguf", arch, tied=tied))
    h = m.hparams
    assert (h.n_layers, h.n_embd, h.n_heads, h.n_kv_heads, h.head_dim) == (2, 64, 4, 2, 16)
    assert (h.n_ff, h.vocab_size, h.context_length, h.rope_dim) == (96, 40, 128, 16)
    assert h.rms_eps == pytest.approx(1e-5) and h.rope_base == 10000.0
    assert h.tied_embeddings is tied
    assert h.qkv_bias is (arch == "qwen2")
    assert m.architecture == arch and m.name == "m"


def test_raw_returns_the_tensor_bytes(tmp_path):
    m = GGUFModel.open(write_model(tmp_path / "m.gguf"))
    raw = m.raw("blk.0.attn_norm.weight")
    assert raw.dtype == np.uint8 and raw.nbytes == 64 * 4
    assert not raw.flags.writeable
    np.testing.assert_array_equal(raw.view(np.float32), np.zeros(64, np.float32))


@pytest.mark.parametrize("key", ["embedding_length", "attention.head_count", "block_count",
                                 "feed_forward_length", "attention.layer_norm_rms_epsilon"])
def test_missing_key_is_named(tmp_path, key):
    with pytest.raises(ModelFormatError, match=f"llama.{key} is missing"):
        GGUFModel.open(write_model(tmp_path / "m.gguf", drop=(key,)))


def test_inconsistent_heads_are_named(tmp_path):
    with pytest.raises(ModelFormatError, match="head_count_kv = 3 does not divide"):
        GGUFModel.open(write_model(tmp_path / "m.gguf", override={"attention.head_count_kv": 3}))


def test_wrong_type_is_named(tmp_path):
    with pytest.raises(ModelFormatError, match="llama.block_count = 'two' is not a int"):
        GGUFModel.open(write_model(tmp_path / "m.gguf", override={"block_count": "two"}))


def test_tensor_shape_disagreeing_with_metadata(tmp_path):
    expected = r"blk.0.ffn_gate.weight has shape \[96, 64\], expected \[128, 64\]"
    with pytest.raises(ModelFormatError, match=expected):
        GGUFModel.open(write_model(tmp_path / "m.gguf", override={"feed_forward_length": 128}))


def test_missing_tensor_is_named(tmp_path):
    with pytest.raises(ModelFormatError, match="tensor blk.1.attn_v.weight is missing"):
        GGUFModel.open(write_model(tmp_path / "m.gguf", drop=("blk.1.attn_v.weight",)))


def test_qwen2_needs_qkv_biases(tmp_path):
    with pytest.raises(ModelFormatError, match="attn_q.bias is missing"):
        GGUFModel.open(write_model(tmp_path / "m.gguf", "qwen2", drop=("blk.0.attn_q.bias",)))


def test_unsupported_architecture(tmp_path):
    path = write_model(tmp_path / "m.gguf", "gemma", tensors={"x": (2, 2)})
    with pytest.raises(UnsupportedModelError, match="'gemma'.*supported: llama, qwen2"):
        GGUFModel.open(path)


def test_rope_scaling_is_refused(tmp_path):
    with pytest.raises(UnsupportedModelError, match="rope.scaling.type = 'yarn'"):
        GGUFModel.open(write_model(tmp_path / "m.gguf", override={"rope.scaling.type": "yarn"}))


def test_missing_file_and_unknown_alias(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model_path(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotFoundError, match="smollm2"):
        GGUFModel.open("not-a-model")


def test_smollm2_alias_resolves_to_the_wheel_file():
    path = resolve_model_path("smollm2")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()


def test_rope_freqs_must_have_one_factor_per_frequency(tmp_path):
    tensors = {**_tensors("llama"), "rope_freqs.weight": (5,)}
    with pytest.raises(ModelFormatError, match=r"rope_freqs.weight has shape \[5\], expected \[8\]"):
        GGUFModel.open(write_model(tmp_path / "m.gguf", tensors=tensors))


def test_close_drops_the_mapping_and_raw_maps_again(tmp_path):
    with GGUFModel.open(write_model(tmp_path / "m.gguf")) as m:
        first = m.raw("output_norm.weight").copy()
    assert m._memmap is None
    np.testing.assert_array_equal(m.raw("output_norm.weight"), first)


def test_gemma3_hparams_follow_llama_cpp(tiny_model):
    h = GGUFModel.open(tiny_model("gemma3", "F32")).hparams
    # Every sixth layer global, the others local with the GGUF's window and RoPE base 10000.
    assert h.local_layers == (0, 1, 2, 3, 4) and h.sliding_window == 5
    assert (h.rope_base, h.rope_base_local) == (1e6, 1e4)
    assert h.embed_scale == pytest.approx(8.0) and h.scale == pytest.approx(0.25)
    assert h.qk_norm and h.post_norms and h.activation == "gelu_tanh"


def test_qwen3_needs_its_qk_norms(tmp_path, tiny_model):
    assert GGUFModel.open(tiny_model("qwen3", "F32")).hparams.qk_norm
    with pytest.raises(ModelFormatError, match="tensor blk.0.attn_q_norm.weight is missing"):
        GGUFModel.open(write_model(tmp_path / "m.gguf", "qwen3"))


def test_phi3_reads_fused_qkv_and_gate_up_and_refuses_longrope(tmp_path, tiny_model):
    path = tiny_model("phi3", "F32")
    h = GGUFModel.open(path).hparams
    assert h.fused_qkv and h.fused_gate_up and not h.qk_norm
    tensors = {name: (info.shape) for name, info in GGUFModel.open(path).tensors.items()}
    assert tensors["blk.0.attn_qkv.weight"] == (64 + 2 * 32, 64) and "blk.0.ffn_gate.weight" not in tensors
    with pytest.raises(UnsupportedModelError, match="rope_factors_long.weight: LongRoPE is not supported"):
        GGUFModel.open(write_model(tmp_path / "m.gguf", "phi3",
                                   tensors={**_tensors("llama"), "rope_factors_long.weight": (8,)}))


def test_released_tensors_leave_the_process_and_read_the_same_again(tiny_model):
    """A build reads each weight once into its constants; ``release`` drops the file's pages it
    read from the process (gemma3-270m held ~250 MiB of them at the end of its build)."""
    from test_graph_arena import mapped_rss

    model = GGUFModel.open(tiny_model("llama", "Q8_0", False, n_embd=256, n_ff=1024))
    names = [n for n in model.tensors if n.endswith(".weight")]
    before = {n: model.raw(n).copy() for n in names}  # every weight's pages read
    weights = sum(model.tensors[n].nbytes for n in names)
    assert mapped_rss([model.raw(names[0]).ctypes.data]) >= weights
    for name in names:
        model.release(name)
    assert mapped_rss([model.raw(names[0]).ctypes.data]) < weights // 8
    assert all(np.array_equal(model.raw(n), before[n]) for n in names)
    model.close()
    model.release(names[0])  # nothing mapped: nothing to drop
