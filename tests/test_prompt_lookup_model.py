"""Prompt lookup on SmolLM2: the same tokens as without it (greedy, seeded, batched, with stop
strings, log-probabilities and a constrained request beside), and drafts verified where text repeats."""

from __future__ import annotations

import pytest

from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.worker.backend import EngineBackend, Finished, Token

F32 = {"inference_precision": "f32", "kv_cache_precision": "f32", "attention": "paged"}
FRUIT = "apples, bananas, cherries, dates, elderberries, figs, grapes, honeydew, kiwis, lemons, mangoes"
TEXT = ("The quick brown fox jumps over the lazy dog. The dog sleeps in the sun all afternoon, and the "
        "fox runs back to the forest.")
COPYING = {
    "list": [{"role": "user", "content": f"Repeat this list exactly, once: {FRUIT}."}],
    "edit": [{"role": "user", "content": f"Rewrite this text exactly, but change 'dog' to 'cat': {TEXT}"}],
}
FREE = {"poem": [{"role": "user", "content": "Write a short poem about the sea."}]}


@pytest.fixture(scope="module")
def all_engines(smollm2_path):
    with (Engine(smollm2_path, settings={**F32, "prompt_lookup": "off"}) as off,
          Engine(smollm2_path, settings={**F32, "prompt_lookup": "on"}) as on,
          Engine(smollm2_path, settings={**F32, "prompt_lookup": "auto"}) as auto):
        yield {"off": off, "on": on, "auto": auto}


@pytest.fixture
def engines(all_engines):
    return all_engines["off"], all_engines["on"]


def lookup_counts(engine) -> dict[str, int]:
    return engine._streams().batcher.lookup


# auto: which passes verify depends on their timing; the tokens must not.
@pytest.mark.parametrize("mode", ["on", "auto"])
@pytest.mark.parametrize("name", [*COPYING, *FREE])
def test_greedy_tokens_with_lookup_equal_those_without(all_engines, name, mode):
    off, spec = all_engines["off"], all_engines[mode]
    messages = {**COPYING, **FREE}[name]
    before = dict(lookup_counts(spec))
    expected = off.chat(messages, max_tokens=72)
    got = spec.chat(messages, max_tokens=72)
    assert (got.token_ids, got.text, got.finish_reason) == (expected.token_ids, expected.text,
                                                            expected.finish_reason)
    if name in COPYING and mode == "on":  # text that repeats its prompt: drafts were verified and held
        assert lookup_counts(spec)["accepted"] - before["accepted"] >= 8


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_seeded_tokens_with_lookup_equal_those_without(all_engines, mode):
    off, spec = all_engines["off"], all_engines[mode]
    sampling = {"max_tokens": 64, "temperature": 0.8, "top_p": 0.95, "seed": 11}
    for messages in [*COPYING.values(), *FREE.values()]:
        assert spec.chat(messages, **sampling).token_ids == off.chat(messages, **sampling).token_ids


def test_stop_strings_and_logprobs_as_without_lookup(engines):
    off, on = engines
    before = dict(lookup_counts(on))
    stop = {"max_tokens": 64, "stop": ["figs"]}
    expected, got = off.chat(COPYING["list"], **stop), on.chat(COPYING["list"], **stop)
    assert got.stop == expected.stop == "figs"
    assert (got.text, got.token_ids) == (expected.text, expected.token_ids)
    assert lookup_counts(on)["accepted"] > before["accepted"]
    # A request with log-probabilities is not drafted for: they are a one-position pass's, exactly.
    sampling = {"max_tokens": 24, "logprobs": 2}
    expected, got = off.chat(COPYING["list"], **sampling), on.chat(COPYING["list"], **sampling)
    assert (got.token_ids, got.logprobs) == (expected.token_ids, expected.logprobs)
    short = {"max_tokens": 5}
    assert on.chat(COPYING["list"], **short).token_ids == off.chat(COPYING["list"], **short).token_ids


def test_batched_with_lookup_equals_each_alone_without(engines):
    off, on = engines
    backend = EngineBackend(on, slots=4)
    assert backend.wait_batching()
    fmt = {"type": "regex", "pattern": "[a-z]+(, [a-z]+){2,5}"}
    reqs = [("list", COPYING["list"], SamplingParams(max_tokens=60)),
            ("edit", COPYING["edit"], SamplingParams(max_tokens=50)),
            ("poem", FREE["poem"], SamplingParams(max_tokens=40, temperature=0.7, seed=3)),
            ("regex", COPYING["list"], SamplingParams(max_tokens=30, response_format=fmt))]
    done, texts, joins, step = {}, {}, {0: reqs[:2], 3: reqs[2:]}, 0
    while backend.active or joins:
        for rid, messages, params in joins.pop(step, []):
            backend.add(rid, messages, params)
        for event in backend.step():
            assert isinstance(event, Token | Finished), event
            if isinstance(event, Token):
                texts[event.request_id] = texts.get(event.request_id, "") + event.delta.text
            else:
                done[event.request_id] = event.completion
        step += 1
    for rid, messages, params in reqs:
        expected = off.chat(messages, **params.to_dict())
        assert done[rid].token_ids == expected.token_ids
        assert done[rid].text == expected.text == texts.get(rid, "")
    assert backend.runs.scheduler.free_blocks == backend.runs.runner.num_blocks
