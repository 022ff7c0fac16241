"""At the default precision (f32 on every CPU class: ovpool.worker.graph.cpu_class.precision; bf16
on AMX made a batched request's tokens differ), a request gives the same tokens whatever else the
worker does: before or after its decode graph is made, batched with others or alone, first or later
(ovpool.worker.graph.cpu_class says how)."""

from __future__ import annotations

import numpy as np
import openvino as ov
import pytest
from test_generate_batcher import drain

from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.worker.backend import EngineBackend
from ovpool.worker.generate.batch import PagedRunner
from ovpool.worker.generate.plan import Chunk
from ovpool.worker.graph import cpu_class

PROMPTS = ["the quick brown fox", "hello", "a b c d e f g h i j k l m n o p q r s t u v w x y z",
           "jumps over the lazy dog and runs far away from the brown fox"]
PARAMS = [SamplingParams(max_tokens=24, ignore_eos=True),
          SamplingParams(max_tokens=17, ignore_eos=True, temperature=0.9, top_p=0.9, seed=7),
          SamplingParams(max_tokens=30, ignore_eos=True),
          SamplingParams(max_tokens=21, ignore_eos=True, temperature=1.2, top_k=20, seed=3)]


def host_precision() -> str:
    """What ``inference_precision=auto`` means on this host."""
    return cpu_class.precision(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name())


def alone(engine: Engine, prompts=PROMPTS, params=PARAMS) -> list[list[int]]:
    return [engine.complete(p, **sp.to_dict()).token_ids for p, sp in zip(prompts, params, strict=True)]


def batched(engine: Engine, prompts=PROMPTS, params=PARAMS) -> list[list[int]]:
    backend = EngineBackend(engine, slots=len(prompts))
    assert backend.wait_batching()
    reqs = [(str(i), p, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]
    done, _, failed = drain(backend, {0: reqs[:2], 2: reqs[2:3], 4: reqs[3:]})  # joins mid-run
    assert not failed
    return [done[str(i)].token_ids for i in range(len(reqs))]


@pytest.mark.parametrize("weight_type", ["Q4_1", "Q4_K", "Q6_K", "Q4_0", "Q5_0", "Q5_1", "Q5_K", "Q3_K",
                                         "Q2_K", "IQ4_NL", "Q8_0", "F16"])
def test_tokens_do_not_depend_on_the_decode_graph_or_the_batch(tiny_model, weight_type):
    path = tiny_model("llama", weight_type, False, n_layers=2, n_embd=256, n_ff=768)
    with Engine(path, settings={"decode_graph": "on", "prefill_chunk": 8}) as eng:
        assert eng.graph_settings["inference_precision"] == host_precision()
        before = alone(eng)
        eng.warm_up()  # makes the decode graph: one-token passes run on it from here on
        assert eng.load_result.decode.ready() is not None
        assert alone(eng) == before
        assert batched(eng) == before
        assert alone(eng) == before  # and again, after the batcher ran


@pytest.mark.parametrize("weight_type", ["Q4_1", "Q4_K", "Q5_K", "Q2_K"])
def test_offset_zero_points_keep_the_tokens_batched_and_alone(tiny_model, weight_type):
    # zero_points=offset (opt-in) adds a ReduceSum and a small f32 MatMul beside each MatMul.
    path = tiny_model("llama", weight_type, False, n_layers=2, n_embd=256, n_ff=768)
    with Engine(path, settings={"decode_graph": "on", "prefill_chunk": 8, "zero_points": "offset"}) as eng:
        before = alone(eng)
        eng.warm_up()
        assert alone(eng) == before
        assert batched(eng) == before


def test_a_preempted_sequence_recomputes_the_same_tokens(tiny_model):
    # Recomputing feeds the generated tokens one per pass again, as they were computed first.
    with Engine(tiny_model("llama", "Q4_K", False, n_layers=2, n_embd=256, n_ff=768)) as eng:
        before = alone(eng)
        batcher = eng.batcher(PagedRunner(eng.compiled, num_blocks=3), max_running=4, prefill_chunk=8)
        preempted, plan = [], batcher.scheduler.plan
        batcher.scheduler.plan = lambda: preempted.extend((result := plan()).preempted) or result
        reqs = [(str(i), p, sp) for i, (p, sp) in enumerate(zip(PROMPTS, PARAMS, strict=True))]
        done, _, failed = drain(batcher, {0: reqs})
        assert preempted and not failed
        assert [done[str(i)].token_ids for i in range(len(reqs))] == before


@pytest.mark.slow
def test_smollm2_greedy_tokens_are_the_same_before_and_after_the_decode_graph(smollm2_path):
    # Before the fix, all four of 48-token greedy runs of these prompts changed at tokens 4-38 on
    # the AVX-512 BF16 class once the decode graph existed.
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    params = [SamplingParams(max_tokens=40, ignore_eos=True)] * 2 + \
        [SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.8, top_p=0.9, seed=11)]
    with Engine(smollm2_path, settings={"decode_graph": "on"}) as eng:
        assert eng.graph_settings["inference_precision"] == host_precision()
        before = alone(eng, prompts, params)
        eng.warm_up()
        assert alone(eng, prompts, params) == before
        assert batched(eng, prompts, params) == before


def _decode(runner: PagedRunner, seqs: dict[str, list[int]], steps: int) -> dict[str, np.ndarray]:
    """Prefill each of ``seqs`` in a pass of its own, then ``steps`` greedy decode passes of all of
    them together; each sequence's logits [steps, vocab]."""
    per_seq = 1 + max(len(ids) for ids in seqs.values()) // runner.block_size + 1
    table = {name: list(range(i * per_seq, (i + 1) * per_seq)) for i, name in enumerate(seqs)}
    tokens, rows = {name: list(ids) for name, ids in seqs.items()}, {name: [] for name in seqs}
    for name, ids in seqs.items():
        logits = runner.forward([Chunk(name, 0, ids, table[name], True)])
        tokens[name].append(int(logits[0].argmax()))
    for _ in range(steps):
        chunks = [Chunk(name, len(ids) - 1, ids[-1:], table[name], True) for name, ids in tokens.items()]
        logits = runner.forward(chunks)
        for chunk, row in zip(chunks, logits, strict=True):
            rows[chunk.seq_id].append(row.copy())
            tokens[chunk.seq_id].append(int(row.argmax()))
    return {name: np.array(r) for name, r in rows.items()}


@pytest.mark.slow
@pytest.mark.parametrize(("kv", "decode"), [("f32", "off"), ("f16", "off"), ("f32", "on")])
def test_smollm2_logits_alone_equal_batched_bit_for_bit(smollm2_path, kv, decode):
    # A lone decode pass took other kernel paths (a one-row MatMul; another attention loop) and
    # differed from its batched row by ~5e-5 at f32 KV, 5e-4 at f16: enough to flip a near-tie.
    # The decode graph (static shapes) takes the padded lone step too: its row is the same bits.
    words = "the quick brown fox jumps over the lazy dog and runs far away ".split()
    with Engine(smollm2_path, settings={"decode_graph": decode, "kv_cache_precision": kv}) as eng:
        graph = eng.paged_graph()
        runner = PagedRunner(graph.compiled, num_blocks=64, decode=graph.decode)
        assert (graph.decode is not None and graph.decode.ready(wait=True) is not None) == (decode == "on")
        others = {f"o{i}": eng.tokenize(" ".join(words[i:] * 3)) for i in range(5)}
        for context in (3, 20, 150):
            prompt = {"a": eng.tokenize(" ".join(words * 20))[:context]}
            alone_rows = _decode(runner, prompt, steps=4)["a"]
            for n in (1, 3, 5):
                batched_rows = _decode(runner, prompt | dict(list(others.items())[:n]), steps=4)["a"]
                gap = np.abs(batched_rows - alone_rows).max()
                assert np.array_equal(batched_rows, alone_rows), f"context {context}, {n} others: {gap}"
