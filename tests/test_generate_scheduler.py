"""The continuous-batching scheduler: budgets, block tables and preemption, without OpenVINO."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovpool.worker.generate.scheduler import Scheduler, prompt_chunk


def make(num_blocks=64, block_size=4, prefill_chunk=8, max_running=4) -> Scheduler:
    return Scheduler(num_blocks=num_blocks, block_size=block_size, prefill_chunk=prefill_chunk,
                     max_running=max_running)


def run_step(s: Scheduler, next_token=lambda seq_id, n: 1000 + n):
    """One plan; sampled chunks get a token appended, as the batch layer does. Returns the plan."""
    plan = s.plan()
    for c in plan.chunks:
        if c.sample:
            s.append(c.seq_id, next_token(c.seq_id, c.start + len(c.tokens)))
    return plan


def test_long_prompt_is_chunked_and_decodes_keep_running():
    s = make(prefill_chunk=8)
    s.add("a", [1, 2, 3])
    assert [(c.seq_id, c.start, len(c.tokens), c.sample) for c in run_step(s).chunks] == [("a", 0, 3, True)]
    s.add("long", list(range(20)))
    for expected_start in (0, 8, 16):
        plan = run_step(s)
        decode = [c for c in plan.chunks if c.seq_id == "a"]
        assert len(decode) == 1 and len(decode[0].tokens) == 1  # "a" decodes every step
        assert plan.num_tokens <= 1 + 8
        chunk = next(c for c in plan.chunks if c.seq_id == "long")
        assert chunk.start == expected_start
    assert chunk.sample and chunk.start + len(chunk.tokens) == 20


def test_decode_feeds_the_sampled_token_at_the_next_position():
    s = make()
    s.add("a", [5, 6])
    run_step(s, lambda seq_id, n: 42)
    (chunk,) = s.plan().chunks
    assert (chunk.start, chunk.tokens, chunk.sample) == (2, [42], True)


def test_block_table_covers_every_position_and_blocks_are_returned():
    s = make(num_blocks=8, block_size=4, prefill_chunk=16)
    s.add("a", list(range(9)))
    (chunk,) = s.plan().chunks
    assert len(chunk.blocks) == 3  # 9 tokens in blocks of 4
    assert s.free_blocks == 5
    s.finish("a")
    assert s.free_blocks == 8 and len(s) == 0


def test_admission_waits_for_a_slot_and_is_fifo():
    s = make(max_running=2)
    for name in "abc":
        s.add(name, [1])
    run_step(s)
    assert s.running == ["a", "b"] and s.waiting == ["c"]
    s.finish("a")
    run_step(s)
    assert s.running == ["b", "c"]


def test_pool_pressure_preempts_the_newest_and_it_recomputes_later():
    s = make(num_blocks=4, block_size=2, prefill_chunk=8, max_running=4)
    s.add("old", [1, 2])
    s.add("new", [3, 4])
    run_step(s)  # each holds 1 block; two free (one spare per running sequence)
    preempted = []
    for _ in range(6):
        plan = run_step(s)
        preempted += plan.preempted
        assert "old" in [c.seq_id for c in plan.chunks]  # the oldest always progresses
    assert preempted and set(preempted) == {"new"}


def test_a_sequence_larger_than_the_cache_is_exhausted():
    s = make(num_blocks=2, block_size=2)
    s.add("a", [1, 2, 3])
    run_step(s)
    run_step(s)  # 4 tokens: two full blocks
    plan = s.plan()  # the 5th token needs a third block, which does not exist
    assert plan.exhausted == ["a"] and not plan.chunks and len(s) == 0 and s.free_blocks == 2


def test_finish_of_a_waiting_sequence_and_duplicates():
    s = make(max_running=1)
    s.add("a", [1])
    s.add("b", [1])
    s.plan()
    s.finish("b")
    s.finish("unknown")
    assert s.waiting == [] and s.running == ["a"]
    with pytest.raises(ValueError, match="already"):
        s.add("a", [1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(1, 12)), min_size=1, max_size=7),
       st.integers(3, 12), st.integers(1, 4), st.integers(1, 9))
def test_every_sequence_is_computed_exactly_in_order(requests, num_blocks, block_size, chunk):
    """Simulate to the end: each sequence's positions are fed 0, 1, 2, ... with no gap or repeat
    (restarting at 0 after a preemption), block tables never overlap, and every one finishes."""
    s = Scheduler(num_blocks=num_blocks, block_size=block_size, prefill_chunk=chunk, max_running=3)
    want = {}
    for i, (prompt, new) in enumerate(requests):
        s.add(str(i), list(range(prompt)))
        want[str(i)] = (prompt, new)
    fed = {k: 0 for k in want}
    generated = {k: 0 for k in want}
    done = set()
    for _ in range(2000):
        if not len(s):
            break
        plan = s.plan()
        for k in plan.preempted:
            fed[k] = 0
        done.update(plan.exhausted)
        owners = {}
        for c in plan.chunks:
            assert c.start == fed[c.seq_id]
            fed[c.seq_id] += len(c.tokens)
            assert len(c.blocks) * block_size >= fed[c.seq_id]
            for b in c.blocks:
                assert owners.setdefault(b, c.seq_id) == c.seq_id
            if c.sample:
                generated[c.seq_id] += 1
                if generated[c.seq_id] >= want[c.seq_id][1]:
                    s.finish(c.seq_id)
                    done.add(c.seq_id)
                else:
                    s.append(c.seq_id, 7)
    assert done == set(want)
    assert s.free_blocks == num_blocks


def test_prompt_chunks_never_leave_one_token_for_a_pass_of_its_own():
    # One-token queries run on the paged-attention decode kernel: a prompt token is only ever
    # computed by the prefill kernel, as when the prompt comes whole.
    assert [prompt_chunk(left, 4) for left in (1, 2, 3, 4, 5, 6)] == [1, 2, 3, 4, 3, 4]
    assert prompt_chunk(3, 2) == 3 and prompt_chunk(4, 1) == 0 and prompt_chunk(2, 1) == 2
    s = make(prefill_chunk=8)
    s.add("p", list(range(17)))
    sizes = [len(run_step(s).chunks[0].tokens) for _ in range(3)]
    assert sizes == [8, 7, 2]


def test_a_preempted_sequence_recomputes_its_generated_tokens_one_per_pass():
    s = make(num_blocks=64, block_size=4, prefill_chunk=8)
    s.add("a", [1, 2, 3])
    for _ in range(4):
        run_step(s)  # prompt, then three decodes: 3 prompt + 4 generated tokens
    s._preempt(s._running[0], s.plan())  # as pool pressure would
    sizes = [len(run_step(s).chunks[0].tokens) for _ in range(5)]
    assert sizes == [3, 1, 1, 1, 1]


def test_a_short_prompt_does_not_wait_behind_a_long_prefill():
    s = make(num_blocks=64, block_size=4, prefill_chunk=8)
    s.add("long", list(range(40)))
    assert [len(c.tokens) for c in run_step(s).chunks] == [8]  # alone: the whole budget
    s.add("short", [1, 2, 3])
    plan = run_step(s)
    sizes = {c.seq_id: (len(c.tokens), c.sample) for c in plan.chunks}
    assert sizes == {"short": (3, True), "long": (5, False)}  # its first token now; the rest to the oldest
    plan = run_step(s)
    assert {c.seq_id: len(c.tokens) for c in plan.chunks} == {"short": 1, "long": 8}


def test_prompts_behind_the_oldest_go_shortest_first():
    s = make(num_blocks=64, block_size=4, prefill_chunk=8, max_running=4)
    plans = []
    for name, n in (("old", 30), ("mid", 12), ("small", 6), (None, 0)):
        if name:
            s.add(name, list(range(n)))
        plans.append([(c.seq_id, len(c.tokens)) for c in run_step(s).chunks])
    assert plans == [[("old", 8)], [("mid", 4), ("old", 4)],  # the oldest keeps half the budget
                     [("small", 4), ("old", 4)],  # a new prompt shorter than "mid" goes before it
                     [("small", 2), ("mid", 2), ("old", 4)]]


def test_a_burst_of_prompts_gets_its_first_tokens_a_pass_at_a_time():
    """Prompts arriving together (a chat's later turns) that all fit in one pass's budget: a pass
    finishes one more only while that costs those already finishing in it less than a pass's
    fixed cost (``pass_cost`` tokens), so the first ones get their first token early; short
    prompts still share a pass."""
    def firsts(length: int) -> list[int]:
        s = Scheduler(num_blocks=200, block_size=4, prefill_chunk=64, max_running=8, pass_cost=8)
        for i in range(4):
            s.add(f"p{i}", list(range(100 * i, 100 * i + length)))
        return [sum(c.sample and len(c.tokens) > 1 for c in run_step(s).chunks) for _ in range(4)]

    assert firsts(12) == [1, 1, 1, 1]  # 12 tokens more for the one finishing > a pass's 8
    assert firsts(4) == [3, 1, 0, 0]  # 4 for one, 8 for two: within 8; 12 for three is not


def test_chats_released_together_get_their_first_tokens_a_pass_apart():
    """Chats whose first turns wait for one shared system prompt start together, each with 25 of
    its own tokens; at the default pass cost each gets a pass of its own, so their answers (of one
    length) end a pass apart and their next turns do not arrive together and queue for one another
    (at a pass cost of 32 they went two to a pass: docs/performance.md, Chat TTFT)."""
    s = Scheduler(num_blocks=400, block_size=32, prefill_chunk=256, max_running=16, caching=True)
    for c in range(4):
        s.add(f"c{c}", list(range(1024)) + list(range(10_000 * (c + 1), 10_000 * (c + 1) + 25)))
    prompts = []
    for _ in range(8):
        prompts.append([(c.seq_id, len(c.tokens)) for c in run_step(s).chunks if len(c.tokens) > 1])
        s.commit()
    assert prompts == [[("c0", 256)]] * 4 + [[(f"c{c}", 25)] for c in range(4)]


def test_chat_turns_finish_a_pass_apart_however_short_their_own_part():
    """``ovpool bench --scenario chat``'s first turns share exactly 32 blocks and compute 19-21
    tokens each, under the pass cost: two to a pass, their answers ended together and their next
    turns, computing the answer's tail too (~35 tokens, over it), queued one a pass behind each other
    (turn 2 at twice turns 3-4's TTFT: docs/performance.md, Chat TTFT). A prompt of 64 tokens or
    more finishes alone in its pass (with ``apart=0`` they went two to a pass)."""
    s = Scheduler(num_blocks=400, block_size=32, prefill_chunk=256, max_running=16, caching=True)
    for c in range(5):
        s.add(f"c{c}", list(range(1024)) + list(range(10_000 * (c + 1), 10_000 * (c + 1) + 19 + c % 3)))
    finished = []
    for _ in range(10):
        finished.append([c.seq_id for c in run_step(s).chunks if c.sample and len(c.tokens) > 1])
        s.commit()
    assert finished == [[]] * 4 + [[f"c{c}"] for c in range(5)] + [[]]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(1, 40), st.integers(1, 6)), min_size=1, max_size=8),
       st.integers(2, 12), st.booleans(), st.integers(0, 40))
def test_budget_is_kept_and_no_prompt_starves(arrivals, chunk, caching, pass_cost):
    """Prompts arriving over time: a pass never holds more than the budget of prompt tokens (one
    over only where a prompt's last three tokens go together, see prompt_chunk) and every request
    is done within a bound on the steps its own and the earlier requests' tokens need (with the
    prefix cache, answer copies ride along: they never delay a prompt), whatever a pass's fixed
    cost makes of how many prompts finish in one pass."""
    s = Scheduler(num_blocks=400, block_size=4, prefill_chunk=chunk, max_running=4, caching=caching,
                  copy_answers=caching, pass_cost=pass_cost)
    budget, pending, done, steps = max(chunk, 2), sorted(arrivals), {}, 0
    bound = sum(p // 2 + n + 2 for _, p, n in arrivals) + max(a for a, _, _ in arrivals) + 1
    left = {}
    while pending or len(s):
        while pending and pending[0][0] <= steps:
            _, p, n = pending.pop(0)
            rid = f"{len(done) + len(left)}"
            s.add(rid, [7] * 3 + list(range(p)) if caching else list(range(p)))
            left[rid] = n
        plan = s.plan()
        s.commit()
        assert sum(len(c.tokens) for c in plan.chunks if len(c.tokens) > 1) <= budget + 1
        for c in plan.chunks:
            if c.sample:
                left[c.seq_id] -= 1
                if left[c.seq_id] == 0:
                    s.finish(c.seq_id)
                    done[c.seq_id] = steps
                    del left[c.seq_id]
                else:
                    s.append(c.seq_id, 9)
        steps += 1
        assert steps <= bound
    assert len(done) == len(arrivals)


def test_a_prompt_waits_for_the_shared_blocks_a_running_prefill_computes():
    s = Scheduler(num_blocks=64, block_size=4, prefill_chunk=8, max_running=4, caching=True)
    shared = list(range(100, 116))
    s.add("first", shared + [1, 2])
    s.add("second", shared + [3, 4])
    seen = []
    for _ in range(3):
        seen.append([c.seq_id for c in run_step(s).chunks])
        s.commit()
    # "second" does not compute the shared 16 tokens a second time: it waits for them.
    assert seen == [["first"], ["first"], ["second", "first"]]
    assert s.cached("second") == 16
