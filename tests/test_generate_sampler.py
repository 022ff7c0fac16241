"""Sampler (greedy, penalties, temperature, top-k, top-p, min-p, seed), log-probabilities, and
StopMatcher (stop strings). Penalties, filters and log-probabilities are compared exactly with a
plain NumPy computation at float32 over the whole vocabulary (sorted in full)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ovpool.errors import InferenceError, InvalidRequestError
from ovpool.sampling_params import SamplingParams
from ovpool.worker.generate.limits import check_logit_bias
from ovpool.worker.generate.logprobs import Logprobs
from ovpool.worker.generate.penalties import Penalties
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
    seen = set(draws(SamplingParams(temperature=2.0, top_k=3, seed=0), logits, 300))
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


# LM-like rows over a 49k vocabulary: a few strong candidates over a long tail, a flat row whose
# nucleus is thousands wide, and one with ties at the top.
VOCAB = 49152
LM_ROWS = [(RNG.standard_normal(VOCAB) * scale).astype(np.float32) for scale in (1.0, 2.5, 4.0)]
for row in LM_ROWS[1:]:
    row[RNG.choice(VOCAB, 5, replace=False)] += 12
LM_ROWS.append(np.zeros(VOCAB, np.float32))
LM_ROWS[-1][[9, 3, 70]] = 5.0


def penalized_reference(x, p: SamplingParams, prompt, output):
    """SamplingParams' steps 1-3 over the whole vocabulary, as vLLM writes them (float32)."""
    x = x.astype(np.float32).copy()
    for token, bias in p.logit_bias:
        x[token] += np.float32(bias)
    seen = np.zeros(len(x), bool)
    seen[list(prompt) + list(output)] = True
    r = np.float32(p.repetition_penalty)
    x = np.where(seen, np.where(x > 0, x / r, x * r), x)
    counts = np.bincount(np.asarray(output, np.int64), minlength=len(x)).astype(np.float32)
    return x - np.float32(p.frequency_penalty) * counts - np.float32(p.presence_penalty) * (counts > 0)


def distribution_reference(x, p: SamplingParams):
    """Temperature, top-k, top-p (of what top-k kept), min-p at float32: the whole vocabulary
    sorted by probability, ties by the lower id (a stable sort of the ids); the kept ids in id
    order with their probabilities."""
    scaled = x.astype(np.float32) / np.float32(p.temperature)
    weights = np.exp(scaled - scaled.max())
    order = np.argsort(-weights, kind="stable")
    w = weights[order]
    n = p.top_k if 0 < p.top_k < len(x) else len(x)
    if p.top_p < 1:
        mass = np.cumsum(w[:n])
        total = mass[-1] if n < len(x) else weights.sum()
        n = min(n, int(np.searchsorted(mass, np.float32(p.top_p) * total)) + 1)
    n = min(n, int(np.count_nonzero(w[:n] >= np.float32(p.min_p)))) if p.min_p > 0 else n
    kept = np.sort(order[:n])  # in id order, as Sampler.distribution gives them
    return kept, weights[kept] / weights[kept].sum(dtype=np.float64)


FILTERS = [{}, {"top_k": 40}, {"top_p": 0.9}, {"top_p": 0.5}, {"top_p": 0.999}, {"min_p": 0.05},
           {"min_p": 1e-9}, {"top_k": 100, "top_p": 0.8}, {"top_k": 3000, "min_p": 0.01},
           {"top_p": 0.9, "min_p": 0.2}, {"top_k": 2}]


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
@pytest.mark.parametrize("temperature", [0.3, 0.8, 1.5])
def test_filters_keep_exactly_what_a_full_sort_keeps(filters, temperature):
    params = SamplingParams(temperature=temperature, seed=0, **filters)
    for x in LM_ROWS:
        ids, probs = Sampler(params).distribution(x)
        want_ids, want_probs = distribution_reference(x, params)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(probs, want_probs)


def test_min_p_keeps_tokens_at_least_that_fraction_of_the_best():
    x = np.log(np.array([0.5, 0.3, 0.1, 0.06, 0.04], np.float32))
    ids, _ = Sampler(SamplingParams(temperature=1.0, min_p=0.15, seed=0)).distribution(x)
    assert sorted(ids.tolist()) == [0, 1, 2]  # 0.06 < 0.15 * 0.5
    assert set(draws(SamplingParams(temperature=1.0, min_p=0.15, seed=0), x, 300)) == {0, 1, 2}


PENALTIES = [{"repetition_penalty": 1.3}, {"repetition_penalty": 0.7}, {"presence_penalty": 1.5},
             {"frequency_penalty": 0.8}, {"frequency_penalty": -2.0, "presence_penalty": 2.0},
             {"logit_bias": {5: 100, 17: -7.5, 40000: 3.25}},
             {"logit_bias": {5: -100}, "repetition_penalty": 1.1, "presence_penalty": 0.5,
              "frequency_penalty": 0.25}]


@pytest.mark.parametrize("penalties", PENALTIES, ids=lambda p: ",".join(p))
def test_penalties_and_bias_equal_the_numpy_formulas(penalties):
    params = SamplingParams(**penalties)
    prompt, output = [5, 17, 17, 300, 9], [17, 42, 42, 42, 7]
    state = Penalties(params, prompt)
    for token in output:
        state.accept(token)
    for x in LM_ROWS:
        before = x.copy()
        np.testing.assert_array_equal(state.apply(x), penalized_reference(x, params, prompt, output))
        np.testing.assert_array_equal(x, before)  # the graph's output buffer is not written


@pytest.mark.parametrize("penalties", PENALTIES, ids=lambda p: ",".join(p))
def test_greedy_and_sampled_choices_see_the_penalized_logits_of_their_own_history(penalties):
    prompt, x = [3, 9, 70], LM_ROWS[3]  # 3, 9 and 70 tie at the top
    for temperature in (0.0, 0.8):
        params = SamplingParams(temperature=temperature, top_p=0.9, seed=1, **penalties)
        sampler, output = Sampler(params, prompt), []
        for _ in range(6):
            ids, probs = sampler.distribution(x)
            want = penalized_reference(x, params, prompt, output)
            if temperature == 0:
                assert ids.tolist() == [int(np.argmax(want))]
            else:
                want_ids, want_probs = distribution_reference(want, params)
                np.testing.assert_array_equal(ids, want_ids)
                np.testing.assert_array_equal(probs, want_probs)
            output.append(sampler.choose(x))
            assert output[-1] in ids


def test_penalties_break_a_greedy_loop():
    x = LM_ROWS[3]  # 3, 9 and 70 tie at the top; ties go to the lower id
    assert draws(SamplingParams(), x, 4) == [3, 3, 3, 3]
    assert draws(SamplingParams(repetition_penalty=2.0), x, 4) == [3, 9, 70, 3]
    assert draws(SamplingParams(presence_penalty=0.5), x, 4) == [3, 9, 70, 3]
    assert draws(SamplingParams(frequency_penalty=0.5, logit_bias={70: 0.75}), x, 4) == [70, 70, 3, 9]
    seen_in_prompt = Sampler(SamplingParams(repetition_penalty=2.0), prompt_ids=[3])
    assert [seen_in_prompt.choose(x) for _ in range(3)] == [9, 70, 3]


def test_logit_bias_outside_the_vocabulary_is_rejected():
    check_logit_bias(SamplingParams(logit_bias={VOCAB - 1: 1}).logit_bias, VOCAB)
    with pytest.raises(InvalidRequestError, match=f"logit_bias.*{VOCAB}"):
        check_logit_bias(SamplingParams(logit_bias={VOCAB: 1}).logit_bias, VOCAB)


class Pieces:
    """A tokenizer's piece(): token i is the text "<i>"."""

    def piece(self, token, skip_special=True):
        return f"<{token}>".encode()


@pytest.mark.parametrize("top", [0, 1, 5, 20])
def test_logprobs_are_the_float32_log_softmax_of_the_raw_logits(top):
    maker = Logprobs(Pieces(), top)
    for x in LM_ROWS:
        shifted = x - x.max()
        want = shifted - np.log(np.exp(shifted).sum())  # float32 throughout
        order = np.argsort(-x, kind="stable")[:top]
        for token in (int(order[0]) if top else 0, 1234):
            got = maker.of(x, token)
            assert (got.chosen.token_id, got.chosen.text, got.chosen.logprob) == \
                (token, f"<{token}>", float(want[token]))
            assert [t.token_id for t in got.top] == order.tolist()
            assert [t.logprob for t in got.top] == [float(want[i]) for i in order]


def test_same_seed_same_tokens_whatever_else_is_sampled_in_between():
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=11)
    alone = draws(params, LM_ROWS[0], 20)
    a, b = Sampler(params), Sampler(SamplingParams(temperature=1.0, top_k=5, seed=11))
    interleaved = []
    for _ in range(20):
        interleaved.append(a.choose(LM_ROWS[0]))
        b.choose(LM_ROWS[1])
    assert interleaved == alone


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


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=1),
                                    SamplingParams(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05, seed=1),
                                    SamplingParams(temperature=0.8, top_p=0.5, seed=1)])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_logits_fail_the_request_clearly(params, bad):
    # A device that computes NaN (OpenVINO 2026.4.1's f16 PagedAttention did) must not turn into
    # token 0 (greedy) or an IndexError in the filters that stops the worker's loop.
    logits = LOGITS[0].copy()
    logits[7] = bad
    with pytest.raises(InferenceError, match=r"non-finite logits \((nan|inf)\).*inference_precision=f32"):
        Sampler(params).choose(logits)
    with pytest.raises(InferenceError, match="non-finite logits"):
        Sampler(params).distribution(logits)
    excluded = np.full(50, -np.inf, np.float32)
    with pytest.raises(InferenceError, match="every token of the vocabulary is excluded"):
        Sampler(params).choose(excluded)
