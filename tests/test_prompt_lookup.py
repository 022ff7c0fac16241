"""Prompt lookup as pure logic: the n-gram proposer, the per-sequence policy, the accept rule's exact
distribution, and the scheduler's verifying chunks and their roll-back."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ovpool.sampling_params import SamplingParams
from ovpool.worker.generate.generation import Generation
from ovpool.worker.generate.lookup import Drafts, NgramIndex, PassCost, Speculation, propose
from ovpool.worker.generate.scheduler import Scheduler

histories = st.lists(st.integers(0, 3), max_size=40)  # a small alphabet: many repeats


@settings(max_examples=300, deadline=None)
@given(histories, st.integers(1, 6), st.integers(1, 3), st.integers(0, 2), st.data())
def test_index_proposes_what_a_scan_finds_however_it_grew(tokens, k, min_n, extra, data):
    max_n = min_n + extra
    split = data.draw(st.integers(0, len(tokens)))
    index = NgramIndex(tokens[:split], min_n=min_n, max_n=max_n)
    for token in tokens[split:]:
        index.append(token)
    assert index.propose(k) == propose(tokens, k, min_n, max_n)


@settings(max_examples=200, deadline=None)
@given(histories, st.integers(1, 6))
def test_a_proposal_continues_an_earlier_occurrence_of_the_suffix(tokens, k):
    n, draft = propose(tokens, k, 1, 3)
    if draft:  # the n-gram ending at the history's end occurred earlier, followed by the draft
        size = len(tokens)
        assert len(draft) == k and 1 <= n <= 3
        assert any(tokens[e - n:e] == tokens[size - n:]
                   and draft == [tokens[e + i % (size - e)] for i in range(k)] for e in range(n, size))
    else:
        assert n == 0 and (tokens[-1:] == [] or tokens[-1] not in tokens[:-1])


def test_a_repeated_list_is_proposed_from_the_prompt():
    index = NgramIndex([5, 1, 2, 3, 4, 9, 1, 2])
    assert index.propose(3) == (2, [3, 4, 9])
    assert NgramIndex([1, 2, 3]).propose(4) == (0, [])


def test_a_span_the_history_repeats_is_proposed_over_and_over():
    # The latest (1, 2) is followed by 1, 2 only: the history repeats them, so does the proposal.
    assert NgramIndex([5, 1, 2, 1, 2]).propose(5) == (2, [1, 2, 1, 2, 1])


def test_auto_verifies_only_what_its_acceptance_pays_for():
    cost = PassCost(switch=0.0)
    for n in (1, 1, 2, 2, 3, 3, 4, 4, 5, 5):  # 1.3 steps a pass over 2 positions, 0.3 each more
        cost.observe(n, 0.010 if n == 1 else 0.013 + 0.003 * (n - 2))
    spec = Speculation([1, 2, 3, 4, 5, 1, 2], k=4, mode="auto", cost=cost, priors=[0.95])
    assert spec.draft(10) == [3, 4, 5, 1]
    assert spec.draft(2) == [3, 4]  # within what the request may still generate
    doubtful = Speculation([1, 2, 3, 4, 5, 1, 2], k=4, mode="auto", cost=cost, priors=[0.25])
    assert doubtful.draft(10) == []
    assert Speculation([1, 2, 3, 1, 2], k=4, mode="on", cost=cost, priors=[0.0]).draft(10) == [3, 1, 2, 3]


def test_a_streak_of_verifying_starts_only_where_it_pays_for_both_shape_changes():
    cost = PassCost(switch=0.3, weight=0.0)  # 1.2 steps a verifying pass; 0.3 a change
    for n in (1, 1, 2, 2, 3, 3):
        cost.observe(n, 0.010 if n == 1 else 0.012)
    history = [1, 2, 3, 4, 5, 6, 1, 2]
    # Two proposed tokens, each right half the time: 1.75 tokens a pass, 1.46 a step in a streak;
    # 0.97 a step where the pass also changes the shape, there and back (1.2 + 0.3 + 0.3).
    spec = Speculation(history, k=2, cost=cost, priors=[0.5])
    cost.last = 1
    assert spec.draft(10) == []
    spec._verifying, cost.last = True, 3  # in a streak of 3-position passes: it goes on
    assert spec.draft(10) == [3, 4]
    cost.last = 2  # after a 2-position pass its shape wins: 1.5 / 1.2 tokens a step, 1.75 / 1.5 for 3
    assert spec.draft(10) == [3]
    sure = Speculation(history, k=2, cost=cost, priors=[0.9])  # 2.71 tokens: pays for both changes
    cost.last = 1
    assert sure.draft(10) == [3, 4]


def test_acceptance_is_learned_by_the_length_of_the_matched_ngram():
    spec = Speculation([1, 2, 3, 4, 1, 2], k=4, mode="auto", priors=[0.9], weight=0.5)
    spec.cost.switch = 0.0
    assert spec.draft(10) == [3, 4, 1, 2]  # the 2-gram (1, 2) matched
    spec.accept([3, 4, 1, 2], [3, 7])  # one right, then the model's own token
    assert (spec.passes, spec.proposed, spec.accepted) == (1, 4, 1)
    assert spec.rates[2] == [0.9 + 0.5 * (1 - 0.9), 0.9 - 0.5 * 0.9, 0.9, 0.9]
    assert spec.rates[1] == spec.rates[3] == [0.9] * 4
    low = Speculation([1, 2, 1], k=4, mode="auto", priors=[0.01, 0.9], weight=0.5)
    assert low.draft(10) == []  # [2, 1, 2, 1] from the 1-gram (1,), not verified: its first token is checked
    low.accept([], [2])
    assert low.rates[1] == [0.01 + 0.5 * 0.99, 0.01, 0.01, 0.01] and low.index.tokens == [1, 2, 1, 2]
    assert low.rates[2] == low.rates[3] == [0.9] * 4


class _Tokenizer:
    eos_ids = (99,)

    def stream_decoder(self):
        return _Decoder()


class _Decoder:
    def push(self, token: int) -> str:
        return f"<{token}>"

    def flush(self) -> str:
        return ""


class _Draws:
    """A stand-in generator: its first draw is ``first``, the others 0.5."""

    def __init__(self, first: float):
        self.values = [first]

    def random(self) -> float:
        return self.values.pop() if self.values else 0.5


def test_the_accept_rule_gives_p_exactly():
    # p = 1/2, 1/4, 1/8, 1/8: each of 64 equal cells of the draw's [0, 1) falls in one token's
    # interval, so counting cells computes the rule's distribution exactly.
    logits = np.log(np.array([0.5, 0.25, 0.125, 0.125], np.float32))
    p = [Fraction(1, 2), Fraction(1, 4), Fraction(1, 8), Fraction(1, 8)]
    cells = 64
    for draft in range(4):
        outcomes = []
        for cell in range(cells):  # the first draw at the middle of each cell
            gen = _generation(SamplingParams(temperature=1.0, seed=0, max_tokens=8, ignore_eos=True))
            gen._sampler._rng = _Draws((cell + 0.5) / cells)
            gen.verify(np.stack([logits, logits]), [draft])
            outcomes.append(gen.token_ids)
        accepted = [o for o in outcomes if o[0] == draft]
        assert all(len(o) == 2 for o in accepted) and Fraction(len(accepted), cells) == p[draft]
        rejected = [o[0] for o in outcomes if o[0] != draft]
        assert all(len(o) == 1 for o in outcomes if o[0] != draft)
        for token in range(4):  # on rejection: p without the draft token, renormalised
            expected = 0 if token == draft else p[token] / (1 - p[draft])
            assert Fraction(rejected.count(token), len(rejected)) == expected


def _toy_logits(prefix: tuple[int, ...]) -> np.ndarray:
    """A deterministic 'model': logits over 6 tokens as a function of the whole prefix."""
    rng = np.random.default_rng(abs(hash(prefix)) % 2**32)
    return (rng.standard_normal(6) * 2).astype(np.float32)


def _generation(params: SamplingParams) -> Generation:
    return Generation(None, None, [0], params, _Tokenizer(), context_length=10_000)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([0.0, 0.7, 1.3]), st.integers(0, 3), st.integers(1, 4))
def test_verified_tokens_are_those_of_one_draw_per_token(seed, temperature, lookup_seed, k):
    params = SamplingParams(temperature=temperature, seed=seed, max_tokens=30, ignore_eos=True,
                            top_p=0.9, repetition_penalty=1.1)
    plain = _generation(params)
    while not plain.finished:
        plain.feed(_toy_logits((0, *plain.token_ids)))
    spec = _generation(params)
    drafts = np.random.default_rng(lookup_seed)
    while not spec.finished:
        # Drafts: sometimes the plain run's own next tokens (accepted), sometimes noise.
        done = len(spec.token_ids)
        draft = plain.token_ids[done:done + k] if drafts.random() < 0.5 else list(drafts.integers(0, 6, k))
        rows = np.stack([_toy_logits((0, *spec.token_ids, *draft[:i])) for i in range(len(draft) + 1)])
        spec.verify(rows, draft)
    assert spec.token_ids == plain.token_ids


def _scheduler(num_blocks=8, caching=False) -> Scheduler:
    return Scheduler(num_blocks=num_blocks, block_size=4, prefill_chunk=16, max_running=4,
                     caching=caching)


def _decoding(s: Scheduler, seq_id: str, prompt: list[int]) -> None:
    s.add(seq_id, prompt)
    s.plan()
    s.commit()
    s.append(seq_id, 50)
    assert s.decoding(seq_id)


def test_a_draft_is_verified_in_its_decode_chunk_and_rolled_back():
    s = _scheduler()
    _decoding(s, "a", [1, 2, 3, 4, 5, 6])  # 6 prompt tokens + 50: positions 0..6
    s.propose("a", [7, 8, 9, 10])
    (chunk,) = s.plan().chunks
    assert (chunk.start, chunk.tokens, chunk.draft, chunk.sample) == (6, [50, 7, 8, 9, 10], 4, True)
    assert len(chunk.blocks) == 3  # positions 6..10
    s.commit()
    s.verified("a", [7, 42])  # 7 held, 42 is the model's own choice after it
    (chunk,) = s.plan().chunks
    assert (chunk.start, chunk.tokens, chunk.draft) == (8, [42], 0)
    assert s.free_blocks == 8 - 3 and len(chunk.blocks) == 3


def test_a_draft_takes_only_free_blocks_and_never_preempts():
    s = _scheduler(num_blocks=4)
    s.add("a", [1, 2, 3, 4, 5, 6, 7])  # 8 tokens with its first: 2 blocks
    s.add("b", [1, 2, 3])  # 4 tokens: 1 block
    s.plan()
    s.commit()
    s.append("a", 50)
    s.append("b", 50)
    s.propose("a", list(range(10)))
    plan = s.plan()
    assert not plan.preempted
    chunk = next(c for c in plan.chunks if c.seq_id == "a")
    assert chunk.draft == 0 and chunk.tokens == [50]  # its one spare block is b's to grow into
    s.commit()


def test_verified_positions_are_not_shared_as_a_decode_would_have_computed_them():
    s = _scheduler(caching=True)
    _decoding(s, "a", [1, 2, 3, 4, 5, 6])
    s.propose("a", [7, 8, 9, 10, 11])
    s.plan()
    s.commit()
    s.verified("a", [7, 8, 9, 10, 11, 12])
    s.plan()
    s.commit()
    # Three full blocks: the first (prompt) is shared, the others hold verified positions.
    s.finish("a")
    assert s.pool.cached == 1


def test_pass_cost_is_timed_and_an_untimed_size_costs_what_a_smaller_timed_one_does():
    cost = PassCost(switch=0.5, weight=0.5, forget=4)
    assert cost(1) == 1.0 and cost(3) == 1.0  # nothing timed yet: try
    for n, seconds in [(1, 0.010), (1, 0.010), (3, 0.050), (3, 0.030)]:  # the first of a shape: a change
        cost.observe(n, seconds)
    assert cost(3) == 3.0 and cost(2) == 1.0 and cost(5) == 3.0
    assert cost.switch == 0.5 and cost.last == 3
    cost.observe(3, 0.020)
    assert cost(3) == 0.025 / 0.010
    for _ in range(5):
        cost.observe(1, 0.010)
    assert cost(3) == 1.0  # not timed for 4 one-position passes: tried again
    cost.observe(3, 0.015)
    cost.observe(3, 0.015)
    assert cost(3) == 1.5


def test_what_a_change_of_shape_costs_is_timed_both_ways():
    cost = PassCost(switch=0.3, weight=0.5)
    for n, seconds in [(1, 0.010), (1, 0.010), (4, 0.016), (4, 0.012)]:
        cost.observe(n, seconds)
    assert cost.switch == 0.3  # 4 positions were not timed yet when their first pass ran
    cost.observe(1, 0.014)  # back to one position: 0.4 of a step more
    assert abs(cost.switch - 0.35) < 1e-12 and cost(1) == 1.0
    cost.observe(4, 0.013)  # 0.1 more than a 4-position pass after another
    assert abs(cost.switch - 0.225) < 1e-12 and cost(4) == 1.2


def test_drafts_of_a_batcher_auto_only_alone_and_where_asked():
    drafts = Drafts("auto", k=3)
    drafts.open("a", [1, 2, 3, 1, 2])
    drafts.open("c", [1, 2, 3, 1, 2], speculate=False)
    drafts._seqs["a"].rates = {n: [0.99] * 3 for n in (1, 2, 3)}
    drafts.cost.switch = 0.0
    room = {"a": 10, "c": 10}.get
    assert list(drafts.drafts(running=2, room=room)) == []  # batched: no drafts in auto
    assert list(drafts.drafts(running=1, room=room)) == [("a", [3, 1, 2])]
    assert list(drafts.drafts(running=1, room={"a": 2}.get)) == [("a", [3])]  # room for 2 tokens
    drafts.accept("a", [3], [3, 9])
    drafts.close("a")
    drafts.close("c")
    assert drafts.counts == {"passes": 1, "proposed": 1, "accepted": 1}
    on = Drafts("on", k=3)
    on.open("a", [1, 2, 1])
    assert list(on.drafts(running=4, room={"a": 9}.get)) == [("a", [2, 1, 2])]


def test_auto_is_off_below_f32():
    from ovpool.worker.exact_modes import resolve_prompt_lookup

    assert resolve_prompt_lookup("auto", {"inference_precision": "f32"}) == "auto"
    assert resolve_prompt_lookup("auto", {"inference_precision": "bf16"}) == "off"
    assert resolve_prompt_lookup("on", {"inference_precision": "bf16"}) == "on"


def test_auto_is_off_with_int8_activations_where_the_prefix_cache_stays():
    # Several positions in one pass moved a position's logits by up to 0.8 from a token a pass
    # there, so a verified proposal is not the token without it; a prompt cut at a block boundary
    # gave the same bits as in one pass, so reused blocks are a fresh run's (AMX).
    from ovpool.worker.exact_modes import exact_prefix_cache, resolve_prompt_lookup

    int8 = {"inference_precision": "f32", "kv_cache_precision": "f32", "activations": "int8"}
    assert resolve_prompt_lookup("auto", int8) == "off"
    assert resolve_prompt_lookup("auto", {**int8, "activations": "float"}) == "auto"
    assert exact_prefix_cache("CPU", int8) == "on"
