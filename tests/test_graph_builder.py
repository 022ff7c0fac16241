"""The OpenVINO graph matches the NumPy reference for every weight type, architecture and layout,
and its KV cache (stateful or explicit) gives the logits of re-scoring the whole sequence."""

from __future__ import annotations

import numpy as np
import openvino as ov
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

from ovpool.settings import Settings
from ovpool.testing.reference import Reference
from ovpool.testing.tiny import ARCHITECTURES, WEIGHT_TYPES
from ovpool.worker.gguf.blocks import unpack
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.gguf.quants import dequantize, rounded_zero
from ovpool.worker.graph import cpu_class
from ovpool.worker.graph import weights as W
from ovpool.worker.graph.builder import build_model, model_ports, port_spec
from ovpool.worker.graph.compile_settings import compile_config, resolve_auto

EXACT = {"inference_precision": "f32", "kv_cache_precision": "f32"}


def compile_graph(path, **settings):
    s = Settings.coerce({**EXACT, **settings})
    model = GGUFModel.open(path)
    core = ov.Core()
    graph = build_model(model, s)
    assert model_ports(graph) == port_spec(model.hparams, s)
    compiled = core.compile_model(graph, "CPU", compile_config(s, "CPU", core))
    return model, compiled.create_infer_request()


def feeds(ids, past: int, logits_from: int = 0, stateful: bool = True) -> dict:
    ids = np.asarray(ids, np.int64).reshape(1, -1)
    n = ids.shape[1]
    f = {"input_ids": ids, "attention_mask": np.ones((1, past + n), np.int64),
         "position_ids": np.arange(past, past + n, dtype=np.int64)[None],
         "logits_from": np.array([logits_from], np.int64)}
    if stateful:
        f["beam_idx"] = np.zeros(1, np.int32)
    return f


def score(request, ids) -> np.ndarray:
    request.reset_state()
    return request.infer(feeds(ids, 0))["logits"][0].copy()


def prompt(model, n=13, seed=1):
    return np.random.default_rng(seed).integers(0, model.hparams.vocab_size, n)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
@pytest.mark.parametrize("tied", [True, False])
def test_logits_match_the_numpy_reference(tiny_model, arch, weight_type, tied):
    model, request = compile_graph(tiny_model(arch, weight_type, tied))
    ids = prompt(model)
    expected = Reference(model).logits(ids)
    np.testing.assert_allclose(score(request, ids), expected, atol=2e-4 * np.abs(expected).max())


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "gemma3", "phi3"])
@pytest.mark.parametrize("prompt_len", [1, 5, 16])
def test_incremental_decoding_equals_rescoring(tiny_model, arch, prompt_len):
    # gemma3's tiny window (5) is shorter than these sequences: its local layers slide.
    model, request = compile_graph(tiny_model(arch, "Q4_K", False))
    ids = prompt(model, prompt_len + 6)
    full = score(request, ids)
    request.reset_state()
    first = request.infer(feeds(ids[:prompt_len], 0, prompt_len - 1))["logits"][0]
    steps = [first[-1]] + [request.infer(feeds(ids[i:i + 1], i))["logits"][0, -1].copy()
                           for i in range(prompt_len, len(ids))]
    np.testing.assert_allclose(np.stack(steps), full[prompt_len - 1:], atol=1e-4)


def test_logits_from_returns_only_the_tail(tiny_model):
    model, request = compile_graph(tiny_model("llama", "Q8_0"))
    ids = prompt(model, 9)
    request.reset_state()
    tail = request.infer(feeds(ids, 0, 6))["logits"][0]
    assert tail.shape == (3, model.hparams.vocab_size)
    np.testing.assert_allclose(tail, score(request, ids)[6:], atol=1e-5)


def test_manual_attention_agrees_with_sdpa(tiny_model):
    path = tiny_model("llama", "Q4_1")
    model, sdpa = compile_graph(path)
    _, manual = compile_graph(path, attention="manual")
    ids = prompt(model)
    np.testing.assert_allclose(score(manual, ids), score(sdpa, ids), atol=1e-4)


def test_explicit_kv_ports_agree_with_state(tiny_model):
    path = tiny_model("llama", "Q4_0")
    model, stateful = compile_graph(path)
    _, stateless = compile_graph(path, stateful=False)
    ids, h = prompt(model, 8), model.hparams
    past = {f"past_key_values.{i}.{kind}": np.zeros((1, h.n_kv_heads, 0, h.head_dim), np.float32)
            for i in range(h.n_layers) for kind in ("key", "value")}
    rows = []
    for i, token in enumerate(ids):
        out = stateless.infer({**feeds([token], i, stateful=False), **past})
        rows.append(out["logits"][0, -1].copy())
        past = {name: out[name.replace("past_key_values", "present")].copy() for name in past}
    assert past["past_key_values.0.key"].shape == (1, h.n_kv_heads, len(ids), h.head_dim)
    np.testing.assert_allclose(np.stack(rows), score(stateful, ids), atol=1e-4)


def test_batch_rows_with_left_padding_match_single_rows(tiny_model):
    model, request = compile_graph(tiny_model("llama", "F16"))
    long, short = prompt(model, 7, seed=2), prompt(model, 4, seed=3)
    ids = np.stack([long, np.concatenate([np.zeros(3, np.int64), short])])
    mask = np.array([[1] * 7, [0] * 3 + [1] * 4])
    positions = np.stack([np.arange(7), np.concatenate([np.zeros(3), np.arange(4)])]).astype(np.int64)
    request.reset_state()
    out = request.infer({"input_ids": ids, "attention_mask": mask, "position_ids": positions,
                         "beam_idx": np.arange(2, dtype=np.int32),
                         "logits_from": np.array([6])})["logits"][:, -1]
    np.testing.assert_allclose(out[0], score(request, long)[-1], atol=1e-4)
    np.testing.assert_allclose(out[1], score(request, short)[-1], atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("real_model", ["smollm2_path", "gemma3_path"])
def test_real_model_top1_agrees_with_the_reference(request, real_model):
    model, infer = compile_graph(request.getfixturevalue(real_model))
    reference = Reference(model)
    agree = total = 0
    for seed, n in ((0, 48), (1, 32), (2, 24)):
        ids = prompt(model, n, seed)
        agree += int((score(infer, ids).argmax(-1) == reference.logits(ids).argmax(-1)).sum())
        total += n
    assert agree / total >= 0.99


@pytest.mark.parametrize("scheme,max_error,min_correlation",
                         [("q8_sym32", 0.02, 0.999), ("q6_k_q8_sym32", 0.02, 0.999), ("q4_asym32", 0.5, 0.9)])
def test_kquant_requant_stays_close_to_the_reference(tiny_model, scheme, max_error, min_correlation):
    model, request = compile_graph(tiny_model("llama", "Q6_K", False), kquant_requant=scheme)
    ids = prompt(model)
    expected = Reference(model).logits(ids)
    got = score(request, ids)
    assert np.corrcoef(got.reshape(-1), expected.reshape(-1))[0, 1] >= min_correlation
    np.testing.assert_allclose(got, expected, atol=max_error * np.abs(expected).max())


def test_q6_k_alone_is_requantized_by_its_choice(tiny_model):
    q4_k, q6_k = (GGUFModel.open(tiny_model("llama", t, False)) for t in ("Q4_K", "Q6_K"))
    name, q6_only = "blk.0.ffn_down.weight", W.Encoding(requant="q6_k_q8_sym32")
    kept, again = W.load(q4_k, name, encoding=q6_only).packed, W.load(q4_k, name).packed
    assert kept.element == again.element and np.array_equal(kept.codes, again.codes)
    assert (W.load(q6_k, name, encoding=q6_only).packed.group, W.load(q6_k, name).packed.group) == (32, 16)
    # No weight with 16-weight groups is left, so the int8 activation group stays the plugin's 32.
    assert W.int8_groups(q6_k, q6_only) == {32} and W.int8_groups(q6_k) == {16}


def f32_copy(source, path, changes: dict):
    """A copy of the F32 model ``source`` (its hyper-parameters and tensors) where ``changes``
    {name: (array, raw GGML type or None)} replaces or adds tensors."""
    model = GGUFModel.open(source)
    writer = GGUFWriter(str(path), model.architecture)
    for key, value in model.metadata.items():
        if key.startswith(model.architecture + "."):
            (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(key, value)
    tensors = {name: (np.asarray(model.raw(name)).view(np.float32).reshape(info.shape), None)
               for name, info in model.tensors.items()}
    for name, (data, raw_dtype) in (tensors | changes).items():
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_llama3_rope_frequency_factors_are_applied(tiny_model, tmp_path):
    source = tiny_model("llama", "F32")
    half = GGUFModel.open(source).hparams.head_dim // 2
    factors = np.linspace(1, 8, half).astype(np.float32)
    path = f32_copy(source, tmp_path / "llama31.gguf", {"rope_freqs.weight": (factors, None)})
    model, request = compile_graph(path)
    _, plain = compile_graph(source)
    ids = prompt(model)
    expected = Reference(model).logits(ids)
    got = score(request, ids)
    np.testing.assert_allclose(got, expected, atol=2e-4 * np.abs(expected).max())
    assert np.abs(got - score(plain, ids)).max() > 1e-3  # the factors change the result


def test_auto_settings_resolve_to_the_device_defaults():
    core = ov.Core()
    values = resolve_auto({"attention": "manual"}, "CPU", core)
    default = lambda prop: core.get_property("CPU", prop).get_type_name()  # noqa: E731
    # f32 where the plugin would pick bf16 (cpu_class.precision): exact and batch-independent
    assert values["inference_precision"] == cpu_class.precision(default("INFERENCE_PRECISION_HINT"))
    assert values["inference_precision"] == "f32"
    assert values["kv_cache_precision"] == "f32"  # at f32 compute: batch-independent (builder.py)
    assert resolve_auto({"inference_precision": "bf16"}, "CPU", core)["kv_cache_precision"] == "f16"
    assert values["attention"] == "manual" and "auto" not in values.values()
    gpu = resolve_auto({"inference_precision": "f16", "kv_cache_precision": "f16"}, "GPU.1", core)
    assert values["q4_storage"] == gpu["q4_storage"] == "i4"  # no GPU plugin query needed
    assert gpu["zero_points"] == "float"
    config = compile_config({"inference_precision": "f32", "kv_cache_precision": "f16"}, "CPU", core)
    assert config == {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f16",
                      "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0, "ENABLE_CPU_PINNING": False}
    bf16 = compile_config({"inference_precision": "bf16"}, "CPU", core)
    assert bf16["INFERENCE_PRECISION_HINT"] == "bf16" and "DYNAMIC_QUANTIZATION_GROUP_SIZE" not in bf16


@pytest.mark.parametrize("zero_points", ["offset", "integer"])
@pytest.mark.parametrize("weight_type,tied", [("Q4_1", False), ("Q4_1", True), ("Q4_K", False),
                                              ("Q5_1", False), ("Q5_K", False), ("Q2_K", True)])
def test_zero_point_forms_match_the_reference(tiny_model, weight_type, tied, zero_points):
    # The forms beside the default float zero point (integer: what the VNNI/AMX classes run at
    # bf16; offset: opt-in), here at f32: as exact as the default.
    model, request = compile_graph(tiny_model("llama", weight_type, tied), zero_points=zero_points)
    ids = prompt(model)
    expected = Reference(model).logits(ids)
    np.testing.assert_allclose(score(request, ids), expected, atol=2e-4 * np.abs(expected).max())


@pytest.mark.parametrize("weight_type,tied", [("Q8_0", True), ("Q4_0", False), ("Q4_K", True)])
def test_int8_activations_leave_the_head_in_f32(tiny_model, weight_type, tied):
    # activations=int8 at f32: the output projection (tied or not) with a float zero point, which
    # the plugin's int8 path does not take; its weights as the file's.
    settings = {**EXACT, "activations": "int8"}
    model, request = compile_graph(tiny_model("llama", weight_type, tied), **settings)
    node = build_model(model, Settings.coerce(settings)).output("logits").get_node().input_value(0).get_node()
    assert node.get_type_name() == "MatMul"
    while node.get_type_name() != "Subtract":
        node = node.input_value(int(node.get_type_name() == "MatMul")).get_node()  # the weight's side
    zero = node.input_value(1).get_node()
    assert zero.get_type_name() == "Constant" and zero.get_element_type() == ov.Type.f32
    ids = prompt(model)
    expected = Reference(model).logits(ids)  # int8 in the layers: near the reference, not at it
    assert np.abs(score(request, ids) - expected).max() < 0.1 * np.abs(expected).max()


def test_rounded_zero_points_compute_the_rounded_weights(tiny_model):
    # GenAI's form of Q4_1 (zero_points=rounded): the graph computes exactly the weights whose zero
    # point was rounded, which are not the file's.
    model, request = compile_graph(tiny_model("llama", "Q4_1", False), zero_points="rounded")
    rounded = Reference(model)
    for name, info in model.tensors.items():
        if info.ggml_type == T.Q4_1:
            packed = unpack(info.ggml_type, model.raw(name), info.shape)
            rounded._cache[name] = dequantize(rounded_zero(packed))
    ids = prompt(model)
    expected, exact = rounded.logits(ids), Reference(model).logits(ids)
    bound = 2e-4 * np.abs(expected).max()
    np.testing.assert_allclose(score(request, ids), expected, atol=bound)
    assert np.abs(exact - expected).max() > 10 * bound


@pytest.mark.parametrize("weight_type,storage,element", [
    ("Q4_1", "i4", "i4"), ("Q4_1", "i8", "i8"), ("Q8_0", "i4", "i8"), ("Q4_K", "i4", "i4"),
    ("Q5_0", "i4", "i8"), ("Q5_1", "i4", "i8"), ("Q5_K", "i4", "i8"), ("Q3_K", "i4", "i4"),
    ("Q3_K", "i8", "i8"), ("Q2_K", "i8", "u2"), ("IQ4_NL", "i4", "i8"), ("IQ4_XS", "i4", "i8")])
def test_compiled_weights_stay_compressed(tiny_model, weight_type, storage, element):
    path = tiny_model("llama", weight_type, False, n_embd=256, n_ff=512)
    model, request = compile_graph(path, q4_storage=storage)
    h = model.hparams
    runtime = request.get_compiled_model().get_runtime_model()
    consts = [op.output(0) for op in runtime.get_ordered_ops()
              if op.get_rt_info()["layerType"].astype(str) == "Const"]
    elements = {c.get_element_type().get_type_name() for c in consts}
    largest_float = max((int(np.prod(list(c.get_shape()))) for c in consts
                         if c.get_element_type() in (ov.Type.f32, ov.Type.f16)), default=0)
    assert element in elements
    # Scales and zero points are per 16 or 32 weights (gate and up stacked, and at f32 a spare row:
    # (2 * n_ff + 1) * n_embd / 16); a decompressed matrix would be n_embd * n_ff.
    assert largest_float <= (2 * h.n_ff + 1) * h.n_embd // 16


@pytest.mark.parametrize("weight_type,requant", [("Q4_0", "none"), ("Q4_1", "none"), ("Q4_K", "none"),
                                                 ("Q4_K", "q4_asym32")])
def test_bytewise_4bit_codes_give_the_same_logits(tiny_model, weight_type, requant):
    path = tiny_model("qwen2", weight_type, False)
    model, packed = compile_graph(path, q4_storage="i4", kquant_requant=requant)
    _, bytewise = compile_graph(path, q4_storage="i8", kquant_requant=requant)
    ids = prompt(model)
    np.testing.assert_array_equal(score(bytewise, ids), score(packed, ids))
