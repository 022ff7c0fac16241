"""The decode graph (ovpool.worker.graph.decode): lone decode steps, padded, run on a static copy of
the paged graph that shares its KV blocks, with the same numbers as the dynamic graph, bit for bit."""

from __future__ import annotations

import numpy as np
import openvino as ov
import pytest
from test_graph_cpu_class import AMX, AVX512_BF16

from ovpool import Engine
from ovpool.testing.tiny import ARCHITECTURES
from ovpool.worker.generate.batch import PagedRunner
from ovpool.worker.generate.scheduler import Chunk
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.graph import builder as graph
from ovpool.worker.graph import cpu_class
from ovpool.worker.graph import decode as decode_graph
from ovpool.worker.graph.paged import PagedAttention

EXACT = {"inference_precision": "f32", "kv_cache_precision": "f32", "attention": "paged"}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_decode_steps_run_on_the_lone_step_graph_with_the_same_logits(tiny_model, arch):
    path = tiny_model(arch, "Q4_1")
    runs = {}
    for choice in ("on", "off"):
        with Engine(path, settings={**EXACT, "decode_graph": choice}) as eng:
            decode = eng.load_result.decode and eng.load_result.decode.ready(wait=True)
            done = eng.complete("the quick brown fox", max_tokens=24, ignore_eos=True)
            runs[choice] = (done.token_ids, eng.logits([5, 9]), eng.logits([7]))
            runner = eng._idle[0].runner
            if choice == "on":
                assert str(decode.input("input_ids").get_partial_shape()) == "[1,2]"
                # The decode request ran (its logits port holds the padded pass's two rows) on the
                # shared blocks.
                assert list(runner.requests[-1].get_tensor("logits").shape)[:2] == [1, 2]
            else:
                assert decode is None and len(runner.requests) == 1
    assert len(runs["on"][0]) == 24 and runs["on"][0] == runs["off"][0]
    for on, off in zip(runs["on"][1:], runs["off"][1:], strict=True):
        assert np.array_equal(on, off)


def test_a_one_token_chunk_without_logits_runs_on_the_dynamic_graph(tiny_model):
    with Engine(tiny_model("llama", "Q8_0"), settings={"decode_graph": "on"}) as eng:
        eng.load_result.decode.ready(wait=True)
        runner = PagedRunner(eng.compiled, num_blocks=4, decode=eng.load_result.decode)
        start = Chunk("a", 0, [3, 4, 5], [0], sample=False)
        assert runner.forward([start]).shape[0] == 0
        assert runner.forward([Chunk("a", 3, [6], [0], sample=False)]).shape[0] == 0
        assert len(runner.requests) == 1  # no one-token pass with logits yet
        assert runner.forward([Chunk("a", 4, [7], [0], sample=True)]).shape[0] == 1
        assert len(runner.requests) == 2


def test_it_is_made_on_demand_and_passes_run_on_the_dynamic_graph_until_then(tiny_model, monkeypatch):
    monkeypatch.setattr(decode_graph, "START_AFTER", 2)
    with Engine(tiny_model("llama", "Q8_0"), settings={"decode_graph": "on"}) as eng:
        decode = eng.load_result.decode
        assert not decode.started  # loading does not make it
        runner = PagedRunner(eng.compiled, num_blocks=2, decode=decode)
        assert runner.forward([Chunk("a", 0, [3], [0], sample=True)]).shape[0] == 1
        assert len(runner.requests) == 1 and not decode.started
        runner.forward([Chunk("a", 1, [4], [0], sample=True)])  # the START_AFTER-th pass without it
        assert decode.started and decode.ready(wait=True) is not None
        runner.forward([Chunk("a", 2, [5], [0], sample=True)])
        assert len(runner.requests) == 2
    with Engine(tiny_model("llama", "Q8_0"), settings={"decode_graph": "on"}) as eng:
        eng.warm_up()  # a warm-up makes it (and sets it up)
        assert eng.load_result.decode.ready() is not None


def test_auto_makes_a_decode_graph_on_the_cpu_for_small_models_only():
    mib, gib = 2**20, 2**30
    smollm2, llama_1b, llama_3b = 100 * mib, 600 * mib, 1700 * mib  # Q4 weights at 135M, 1.1B, 3B
    resolve = decode_graph.resolve
    assert resolve("auto", "CPU", smollm2, 24 * gib)
    assert not resolve("auto", "CPU", llama_1b, 24 * gib) and not resolve("auto", "CPU", llama_3b, 512 * gib)
    assert not resolve("auto", "CPU", smollm2, gib)  # twice the weights past an eighth of memory
    assert not resolve("auto", "GPU.1", smollm2, 24 * gib)
    assert resolve("on", "GPU.1", llama_3b, gib) and not resolve("off", "CPU", smollm2, 24 * gib)


def test_auto_makes_none_where_the_cpu_class_gains_too_little_for_it():
    gib = 2**30
    assert not decode_graph.resolve("auto", "CPU", 2**20, 24 * gib, paying=False)
    assert decode_graph.resolve("on", "CPU", 2**20, 24 * gib, paying=False)  # asked for: kept
    assert decode_graph.auto_text("CPU", paying=False).startswith("off on this CPU class")
    assert decode_graph.auto_text("CPU").startswith("on for models of up to")


def test_an_amx_engine_at_f32_has_no_decode_graph_and_the_same_tokens(tiny_model, monkeypatch):
    # The class is faked (cpu_class.CpuInfo.read), so any host runs both; f32 everywhere, so the
    # tokens with the decode graph (another class) and without it (AMX) must be the same.
    path, tokens = tiny_model("llama", "Q4_1"), {}
    for cpu in (AMX, AVX512_BF16):
        monkeypatch.setattr(cpu_class.CpuInfo, "read", classmethod(lambda cls, core=None, cpu=cpu: cpu))
        with Engine(path, cache_dir="", settings={"inference_precision": "f32"}) as eng:
            assert (eng.load_result.decode is None) == (cpu is AMX)
            eng.warm_up()  # makes the decode graph where there is one: the steps below run on it
            done = eng.complete("the quick brown fox", max_tokens=16, ignore_eos=True)
            tokens[cpu.class_name] = done.token_ids
    assert len(tokens["AMX"]) == 16 and tokens["AMX"] == tokens["AVX-512 VNNI/BF16"]


def test_auto_resolves_by_the_models_weight_bytes(tiny_model):
    with GGUFModel.open(tiny_model("llama", "Q8_0")) as model:
        weights = decode_graph.weight_bytes(model)
        assert weights == sum(int(model.raw(name).nbytes) for name in model.tensors)
        assert decode_graph.wanted("auto", "CPU", model) == decode_graph.resolve(
            "auto", "CPU", weights, decode_graph.physical_memory())


def test_a_decode_graph_that_cannot_compile_is_left_out_with_a_warning(tiny_model, caplog):
    path = tiny_model("llama", "Q8_0")
    build = lambda: graph.build_model(GGUFModel.open(path), {"attention": "paged"}, PagedAttention())  # noqa: E731
    decode = decode_graph.DecodeGraph(build, ov.Core(), "NO_SUCH_DEVICE", {})
    assert decode.ready(wait=True) is None
    assert "decode graph not compiled" in caplog.text and "NO_SUCH_DEVICE" in caplog.text


@pytest.mark.parametrize(("args", "expected"), [
    (["--max-tokens", "6"], "off"),  # finishes before a decode graph would pay for its compile
    (["--max-tokens", "2000"], "auto"),
    (["--max-tokens", "6", "--set", "decode_graph=on"], "on"),  # asked for: kept
])
def test_generate_leaves_the_decode_graph_out_of_short_generations(tiny_model, monkeypatch, args, expected):
    from click.testing import CliRunner

    from ovpool.cli import main
    from ovpool.worker import engine

    seen = []
    real = engine.Engine

    def spy(model, settings=None, **kwargs):
        seen.append(settings.decode_graph)
        return real(model, settings=settings, **kwargs)

    monkeypatch.setattr(engine, "Engine", spy)
    done = CliRunner().invoke(main, ["generate", "--model", str(tiny_model("llama", "Q8_0")), *args, "hi"])
    assert done.exit_code == 0, done.output
    assert seen == [expected]
