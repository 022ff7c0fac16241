"""The weight types real "Q4_K_M"/"Q5_K_M" files hold, through the engine at f32: logits equal the
NumPy reference (weights dequantized by gguf.quants), incremental decoding equals rescoring, and
batched generation equals each request alone; mixed embedding types go through the Gather path."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from test_generate_batcher import PROMPTS, drain
from test_graph_builder import compile_graph, f32_copy, feeds, prompt, score

from ovpool import Engine
from ovpool.errors import UnsupportedModelError
from ovpool.sampling_params import SamplingParams
from ovpool.testing.reference import Reference
from ovpool.worker.backend import EngineBackend
from ovpool.worker.gguf.model import GGUFModel

EXACT = {"inference_precision": "f32", "kv_cache_precision": "f32"}
TYPES = ["Q5_0", "Q5_1", "Q5_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS"]


@pytest.mark.parametrize("weight_type", TYPES)
def test_engine_logits_match_the_reference_and_batched_equals_alone(tiny_model, weight_type):
    path = tiny_model("qwen2", weight_type, False)
    ids = [int(t) for t in prompt(GGUFModel.open(path), 13, seed=4)]
    expected = Reference(GGUFModel.open(path)).logits(np.array(ids))
    with Engine(path, settings={**EXACT, "prefill_chunk": 8}) as eng:
        np.testing.assert_allclose(eng.logits(ids), expected, atol=2e-4 * np.abs(expected).max())
        params = SamplingParams(max_tokens=12, ignore_eos=True)
        alone = {str(i): eng.complete(p, **params.to_dict()) for i, p in enumerate(PROMPTS)}
        backend = EngineBackend(eng, slots=len(PROMPTS))
        assert backend.wait_batching()
        done, _, failed = drain(backend, {0: [(str(i), p, params) for i, p in enumerate(PROMPTS)]})
        assert not failed
        assert {rid: c.token_ids for rid, c in done.items()} == {r: c.token_ids for r, c in alone.items()}
        # Greedy decoding one token at a time picks what rescoring the whole sequence ranks first.
        head = eng.prompt_ids(PROMPTS[0])
        ranked = eng.logits(head + alone["0"].token_ids).argmax(-1)[len(head) - 1:-1]
        assert ranked.tolist() == alone["0"].token_ids


@pytest.mark.parametrize("weight_type", TYPES)
def test_incremental_decoding_equals_rescoring(tiny_model, weight_type):
    model, request = compile_graph(tiny_model("llama", weight_type, True))
    ids = prompt(model, 11)
    full = score(request, ids)
    request.reset_state()
    first = request.infer(feeds(ids[:5], 0, 4))["logits"][0]
    steps = [first[-1]] + [request.infer(feeds(ids[i:i + 1], i))["logits"][0, -1].copy()
                           for i in range(5, len(ids))]
    np.testing.assert_allclose(np.stack(steps), full[4:], atol=1e-4)


@pytest.mark.parametrize("embed_type,weight_type", [("Q8_0", "Q5_0"), ("Q5_0", "Q4_K")])
def test_a_tied_embedding_of_another_type_than_the_matrices(tiny_model, embed_type, weight_type):
    path = tiny_model("llama", weight_type, True, embed_type=embed_type)
    model = GGUFModel.open(path)
    assert model.tensors["token_embd.weight"].ggml_type.name == embed_type
    assert model.tensors["blk.0.ffn_up.weight"].ggml_type.name == weight_type
    ids = [int(t) for t in prompt(model, 9, seed=5)]
    expected = Reference(model).logits(np.array(ids))
    with Engine(path, settings=EXACT) as eng:
        np.testing.assert_allclose(eng.logits(ids), expected, atol=2e-4 * np.abs(expected).max())


def test_a_weight_type_without_a_form_is_refused_by_name(tiny_model, tmp_path):
    source = tiny_model("llama", "F32", n_embd=256, n_ff=256)
    block, size = GGML_QUANT_SIZES[T.IQ2_XXS]  # a lattice codebook: no form in the graph
    codes = np.zeros((256, 256 // block * size), np.uint8)
    path = f32_copy(source, tmp_path / "iq2.gguf", {"blk.1.ffn_up.weight": (codes, T.IQ2_XXS)})
    with pytest.raises(UnsupportedModelError, match=r"blk.1.ffn_up.weight has weight type IQ2_XXS; "
                                                    r"supported: .*IQ4_XS.*Q2_K.*Q5_0"):
        GGUFModel.open(path)
