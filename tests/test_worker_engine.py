"""Engine: generation behaviour on tiny fixture models, and real answers from SmolLM2 (slow)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from ovpool import Engine
from ovpool.cli import main as cli_main
from ovpool.errors import InvalidRequestError
from ovpool.sampling_params import SamplingParams

PROMPT = "the quick brown fox"


def fresh_engine(path):
    """A fresh engine per test (~0.25 s): one shared by the module carried its decode graph's pass
    count (ovpool.worker.graph.decode.START_AFTER) from test to test, so which graph ran a step, and
    at bf16 which tokens came out, depended on the tests before. Each test here stays under that
    count, so all its one-token steps run on one graph."""
    with Engine(path) as eng:
        yield eng
        decode = eng.load_result.decode
        assert decode is None or not decode.started, "the test switched graphs mid-way"


@pytest.fixture
def engine(tiny_model):
    yield from fresh_engine(tiny_model(arch="llama", weight_type="Q8_0"))


@pytest.fixture
def qwen_engine(tiny_model):
    yield from fresh_engine(tiny_model(arch="qwen2", weight_type="Q4_1"))


def test_same_seed_same_tokens_and_other_seeds_differ(engine):
    def sample(seed):
        return engine.complete(PROMPT, max_tokens=24, temperature=1.5, seed=seed, ignore_eos=True).token_ids

    first = sample(11)
    assert sample(11) == first
    assert sample(12) != first and sample(13) != first


def test_greedy_tokens_are_the_argmax_of_teacher_forced_logits(qwen_engine):
    # Decoding with the KV cache must agree with re-scoring the whole sequence.
    prompt = qwen_engine.tokenize(PROMPT)
    out = qwen_engine.complete(prompt, max_tokens=12, ignore_eos=True)
    logits = qwen_engine.logits(prompt + out.token_ids[:-1])
    assert logits.shape == (len(prompt) + len(out.token_ids) - 1, qwen_engine.hparams.vocab_size)
    assert logits.dtype == np.float32
    assert list(logits[len(prompt) - 1:].argmax(axis=-1)) == out.token_ids


def test_max_tokens_finishes_with_length_and_counts_usage(engine):
    out = engine.complete(PROMPT, max_tokens=7, ignore_eos=True)
    assert out.finish_reason == "length"
    assert len(out.token_ids) == 7
    assert out.usage.prompt_tokens == len(engine.tokenize(PROMPT))
    assert out.usage.completion_tokens == 7
    assert out.timings["ttft_s"] > 0 and out.timings["decode_tps"] > 0


def test_stop_string_ends_the_text_before_it(engine):
    full = engine.complete(PROMPT, max_tokens=40, ignore_eos=True).text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert len(stop) == 3
    out = engine.complete(PROMPT, max_tokens=40, ignore_eos=True, stop=[stop, "\x00never"])
    assert out.finish_reason == "stop"
    assert out.text == full[:full.index(stop)]


def test_eos_stops_unless_ignore_eos(engine, monkeypatch):
    greedy = engine.complete(PROMPT, max_tokens=10, ignore_eos=True).token_ids
    eos = greedy[4]
    monkeypatch.setattr(engine.tokenizer, "eos_ids", frozenset({eos}))
    stopped = engine.complete(PROMPT, max_tokens=10)
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == greedy[:greedy.index(eos)]
    ignored = engine.complete(PROMPT, max_tokens=10, ignore_eos=True)
    assert ignored.finish_reason == "length" and ignored.token_ids == greedy


@pytest.mark.parametrize("stop", [(), ("e",)])
def test_stream_deltas_concatenate_to_the_completion(engine, stop):
    kwargs = dict(max_tokens=30, temperature=0.8, seed=5, ignore_eos=True, stop=stop)
    deltas = list(engine.stream(PROMPT, **kwargs))
    out = engine.complete(PROMPT, **kwargs)
    assert "".join(d.text for d in deltas) == out.text
    assert all(d.text for d in deltas)
    indexes = [d.index for d in deltas]
    assert indexes == sorted(set(indexes))
    assert [d.token_id for d in deltas] == [out.token_ids[i] for i in indexes]


def test_interleaved_generations_match_each_alone(engine):
    runs = [("one two three", SamplingParams(max_tokens=16, temperature=1.0, seed=1, ignore_eos=True)),
            ("a b", SamplingParams(max_tokens=9, ignore_eos=True)),
            (PROMPT * 3, SamplingParams(max_tokens=12, temperature=0.7, seed=9, ignore_eos=True))]
    # Chunked prefill on both sides: with a u8 KV cache, chunking itself changes the numerics a little.
    alone = []
    for prompt, params in runs:
        with engine.generation(prompt, params, prefill_chunk=4) as gen:
            list(gen)
            alone.append(gen.completion().token_ids)
    gens = [engine.generation(p, params, prefill_chunk=4) for p, params in runs]
    while not all(g.finished for g in gens):
        for g in gens:
            g.step()
    assert [g.completion().token_ids for g in gens] == alone


def test_a_generation_closed_midway_leaves_the_others_as_they_were(engine):
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    expected = engine.complete("a b", **params.to_dict()).token_ids
    left, kept = engine.generation(PROMPT, params), engine.generation("a b", params)
    left.step()
    left.close()
    assert left.step() is None and not left.finished
    with pytest.raises(InvalidRequestError, match="not finished"):
        left.completion()
    list(kept)
    assert kept.completion().token_ids == expected


def test_chat_renders_the_template(engine):
    messages = [{"role": "user", "content": "hello there"}]
    out = engine.chat(messages, max_tokens=5, ignore_eos=True)
    expected = engine.tokenize("<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n",
                               add_special=False)
    assert out.usage.prompt_tokens == len(expected)
    assert len(out.token_ids) == 5
    assert engine.load_report["chat"] is True  # READY tells the broker: /v1/models lists it as chat


def test_bad_prompts_are_clear_errors(tiny_model):
    with Engine(tiny_model(arch="llama", weight_type="Q8_0"), settings={"max_prompt_tokens": 50}) as eng:
        ctx = eng.hparams.context_length
        with pytest.raises(InvalidRequestError) as never_fits:  # before max_prompt_tokens: it says more
            eng.complete([5] * ctx, max_tokens=7)
        assert str(never_fits.value) == (
            f"the prompt has {ctx} tokens and max_tokens = 7, but the model's context holds {ctx} tokens"
            f" in all: the prompt alone leaves no room for 1 new token(s); shorten it to at most"
            f" {ctx - 1} tokens")
        with pytest.raises(InvalidRequestError, match="60 tokens.*max_prompt_tokens = 50"):
            eng.complete([5] * 60)
        with pytest.raises(InvalidRequestError, match="empty"):
            eng.complete([])
        with pytest.raises(InvalidRequestError, match="vocabulary"):
            eng.logits([1, eng.hparams.vocab_size])
        # A rejected request leaves the engine usable.
        assert len(eng.complete(PROMPT, max_tokens=3, ignore_eos=True).token_ids) == 3


def test_a_context_that_fills_before_max_tokens_says_so(engine, caplog):
    ctx = engine.hparams.context_length
    with caplog.at_level("INFO", logger="ovpool.worker"):
        out = engine.complete([5] * (ctx - 10), max_tokens=100, ignore_eos=True)
    assert out.finish_reason == "length" and len(out.token_ids) == 10
    assert out.note == (f"stopped at the model's context of {ctx} tokens ({ctx - 10} prompt + 10"
                        " generated), before max_tokens = 100; shorten the prompt for a longer answer")
    assert f"a generation {out.note}" in caplog.messages
    assert engine.complete([5] * 10, max_tokens=3, ignore_eos=True).note == ""  # max_tokens: no note


def test_cli_generate_streams_text_and_reports_timing(tiny_model, engine):
    path = tiny_model(arch="llama", weight_type="Q8_0")
    result = CliRunner().invoke(cli_main, ["generate", "--model", str(path), "--max-tokens", "6",
                                           "--ignore-eos", PROMPT])
    assert result.exit_code == 0, result.output
    expected = engine.complete(PROMPT, max_tokens=6, ignore_eos=True).text
    assert expected in result.stdout
    assert "6 new tokens" in result.stderr


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with Engine(smollm2_path) as eng:
        yield eng


@pytest.mark.slow
def test_smollm2_knows_the_capital_of_france(smollm2):
    out = smollm2.complete("The capital of France is", max_tokens=4)
    assert out.text.startswith(" Paris")


@pytest.mark.slow
def test_smollm2_chat_answers_and_stops_at_end_of_turn(smollm2):
    messages = [{"role": "user", "content": "Say hello in one short sentence."}]
    out = smollm2.chat(messages, max_tokens=64)
    assert out.text.strip()
    assert out.finish_reason == "stop" and len(out.token_ids) < 64
    longer = smollm2.chat(messages, max_tokens=64, ignore_eos=True)
    assert longer.finish_reason == "length" and len(longer.token_ids) == 64


def test_stateless_graph_generates_like_the_stateful_one(tiny_model):
    path = tiny_model(arch="qwen2", weight_type="Q4_1")
    exact = {"kv_cache_precision": "f32", "inference_precision": "f32"}
    runs = []
    for stateful in (True, False):
        with Engine(path, settings={**exact, "stateful": stateful}) as eng:
            runs.append(eng.complete(PROMPT, max_tokens=12, ignore_eos=True).token_ids)
    assert runs[0] == runs[1]


def test_warm_up_runs_at_load_or_on_request_and_leaves_no_state_behind(tiny_model):
    path = tiny_model(arch="llama", weight_type="Q8_0")
    with Engine(path) as lazy:  # the default, idle: a bare engine leaves the set-up to its requests
        assert "warm-up" not in lazy.load_report["seconds"] and not lazy.warmed
        expected = lazy.complete(PROMPT, max_tokens=8, ignore_eos=True).token_ids
        lazy.warm_up()
        assert lazy.warmed and "warm-up" in lazy.load_report["seconds"]
        assert lazy.complete(PROMPT, max_tokens=8, ignore_eos=True).token_ids == expected
    with Engine(path, settings={"warm_up": "load"}) as warm:
        assert warm.warmed and "warm-up" in warm.load_report["seconds"]
        assert warm.complete(PROMPT, max_tokens=8, ignore_eos=True).token_ids == expected
