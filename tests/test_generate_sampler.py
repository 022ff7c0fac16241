"""Sampler (greedy, temperature, top-k, top-p, seed) and StopMatcher (stop strings)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ovpool.sampling_params import SamplingParams
from ovpool.worker.generate.sampler import Sampler, StopMatcher

RNG = np.random.default_rng(1234)
LOGITS = [RNG.standard_normal(50).astype(np.float32) for _ in range(20)]


def draws(params: SamplingParams, logits: np.ndarray, n: int) -> list[int]:
    sampler = Sampler(params)
    return [sampler.choose(logits) for _ in range(n)]


def test_greedy_is_argmax():
    for logits in LOGITS:
        assert Sampler(SamplingParams()).choose(logits) == int(np.argmax(logits))


@pytest.mark.parametrize("filters", [{"top_k": 1}, {"top_p": 1e-6}])
def test_tightest_filters_equal_greedy(filters):
    for seed, logits in enumerate(LOGITS):
        params = SamplingParams(temperature=1.5, seed=seed, **filters)
        assert draws(params, logits, 5) == [int(np.argmax(logits))] * 5


def test_same_seed_same_tokens_other_seed_differs():
    params = SamplingParams(temperature=1.0, seed=7)
    flat = np.zeros(50, np.float32)
    assert draws(params, flat, 40) == draws(params, flat, 40)
    assert draws(params, flat, 40) != draws(SamplingParams(temperature=1.0, seed=8), flat, 40)


def test_top_k_keeps_only_the_k_best():
    logits = LOGITS[0]
    best3 = set(np.argsort(-logits)[:3].tolist())
    seen = set(draws(SamplingParams(temperature=5.0, top_k=3, seed=0), logits, 300))
    assert seen == best3


def test_top_p_keeps_smallest_prefix_reaching_the_mass():
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    seen = set(draws(SamplingParams(temperature=1.0, top_p=0.5, seed=0), np.log(probs), 300))
    assert seen == {0, 1}


def test_top_p_on_a_flat_distribution_with_a_wide_nucleus():
    # Thousands of tokens in the nucleus: more than the sampler's partitioned head holds.
    logits = -np.linspace(0, 3, 5000).astype(np.float32)
    probs = np.exp(logits) / np.exp(logits).sum()
    nucleus = int(np.searchsorted(np.cumsum(probs), 0.5)) + 1
    seen = draws(SamplingParams(temperature=1.0, top_p=0.5, seed=0), logits, 1000)
    assert max(seen) < nucleus and max(seen) > 0.9 * nucleus > 600


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_draws_follow_the_tempered_softmax(temperature):
    logits = np.array([2.0, 1.0, 0.0, -1.0], np.float32)
    expected = np.exp(logits / temperature) / np.exp(logits / temperature).sum()
    counts = np.bincount(draws(SamplingParams(temperature=temperature, seed=3), logits, 4000), minlength=4)
    np.testing.assert_allclose(counts / 4000, expected, atol=0.03)


def run(stop: tuple[str, ...], deltas: list[str]) -> tuple[list[str], bool]:
    matcher = StopMatcher(stop)
    out = []
    for delta in deltas:
        text, stopped = matcher.feed(delta)
        out.append(text)
        if stopped:
            return out, True
    return [*out, matcher.flush()], False


def test_stop_string_split_across_tokens_is_held_back_then_cut():
    out, stopped = run(("END",), ["Hello E", "N", "D and more"])
    assert stopped and out == ["Hello ", "", ""]


def test_held_text_is_released_when_it_cannot_be_a_stop():
    out, stopped = run(("Hello",), ["Hel", "p me"])
    assert not stopped and out == ["", "Help me", ""]


def test_first_stop_to_complete_wins():
    out, stopped = run(("world", "lo"), ["hello world"])
    assert stopped and "".join(out) == "hel"
    # "b" completes before "XbX" does, so the text is cut the same way in one chunk or three.
    for chunks in (["XbX"], ["X", "b", "X"]):
        out, stopped = run(("XbX", "b"), chunks)
        assert stopped and "".join(out) == "X"


@given(st.text(alphabet="abXY", max_size=30), st.lists(st.integers(0, 30), max_size=8),
       st.lists(st.text(alphabet="abXY", min_size=1, max_size=4), min_size=1, max_size=3))
def test_stop_matcher_equals_cutting_the_whole_text(text, cuts, stops):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    deltas = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    out, stopped = run(tuple(stops), deltas)
    # Whatever the chunking: cut where the first stop string to complete starts.
    hits = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    assert stopped == bool(hits)
    assert "".join(out) == (text[:min(hits)[1]] if hits else text)
