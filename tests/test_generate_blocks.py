"""The prefix cache as pure logic: content-addressed blocks, reference counts, LRU eviction, route keys."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovpool.worker.generate.blocks import BlockPool, Removed, Stored, chain_hashes
from ovpool.worker.generate.scheduler import Scheduler


def make(num_blocks=16, block_size=4, prefill_chunk=64, max_running=4, exact=True) -> Scheduler:
    return Scheduler(num_blocks=num_blocks, block_size=block_size, prefill_chunk=prefill_chunk,
                     max_running=max_running, caching=True, exact=exact, seed=b"graph")


def step(s: Scheduler):
    """One plan whose pass ran (committed); sampled chunks get token 99 appended."""
    plan = s.plan()
    s.commit()
    for c in plan.chunks:
        if c.sample:
            s.append(c.seq_id, 99)
    return plan


def first_chunk(s: Scheduler, seq_id: str, prompt, keys=()):
    s.add(seq_id, prompt, keys)
    return next(c for c in step(s).chunks if c.seq_id == seq_id)


def test_a_sequence_starts_after_the_cached_full_blocks_of_its_prompt():
    s = make()
    first_chunk(s, "a", list(range(10)))
    s.finish("a")
    chunk = first_chunk(s, "b", list(range(10)) + [7, 7])
    assert (chunk.start, chunk.tokens) == (8, [8, 9, 7, 7])  # two full blocks of 4 reused
    assert (s.prompt_tokens, s.cached_prompt_tokens) == (22, 8)


@pytest.mark.parametrize(("prompt", "start"), [(8, 4), (9, 4), (10, 8), (3, 0)])
def test_at_least_two_prompt_tokens_are_computed(prompt, start):
    # A whole prompt cached still computes its last token (to sample from); one prompt token alone
    # would go through the decode kernel, unlike in a run of its own (scheduler.prompt_chunk).
    s = make()
    first_chunk(s, "a", list(range(12)))
    s.finish("a")
    chunk = first_chunk(s, "b", list(range(prompt)))
    assert chunk.start == start and len(chunk.tokens) >= 2 or prompt < 2


def test_blocks_are_shared_only_once_their_pass_has_run():
    s = make()
    s.add("a", list(range(9)))
    s.add("b", list(range(9)))
    plan = s.plan()  # both prefill in one pass: nothing is cached yet
    assert [c.start for c in plan.chunks] == [0, 0]
    s.commit()
    s.add("c", list(range(9)))
    (chunk,) = [c for c in s.plan().chunks if c.seq_id == "c"]
    a_blocks = next(c.blocks for c in plan.chunks if c.seq_id == "a")
    assert chunk.start == 4 and chunk.blocks[0] == a_blocks[0] and s.pool.refs(a_blocks[0]) == 2


def test_freed_blocks_stay_cached_until_the_pool_needs_them_least_recently_used_first():
    s = make(num_blocks=6, block_size=4)
    first_chunk(s, "a", list(range(13)))  # 4 blocks: 3 full ones get cached
    s.finish("a")
    assert s.free_blocks == 6 and s.pool.cached == 3
    first_chunk(s, "b", [50 + i for i in range(16)])  # 4 blocks: 3 empty ones, then a's tail block
    assert s.pool.evictions == 1
    s.finish("b")
    assert first_chunk(s, "c", list(range(13))).start == 8  # a's first two blocks are still there


def test_a_preempted_sequence_finds_its_own_blocks_again():
    s = make(block_size=2)
    s.add("a", [1, 2, 3])
    for _ in range(4):
        step(s)  # 3 prompt + 3 generated tokens computed, one more to feed
    s._preempt(s._running[0], s.plan())  # as pool pressure would
    chunk = step(s).chunks[0]
    assert (chunk.start, chunk.tokens) == (6, [99])  # three full blocks found again


@pytest.mark.parametrize(("exact", "start"), [(True, 4), (False, 12)])
def test_a_resent_answer_is_reused_only_when_not_exact(exact, start):
    # Generated tokens are computed one per pass (the decode kernel): their blocks serve a later
    # prompt that resends them only with exact=False; exact, the next turn stops where they begin.
    s = make(block_size=4, exact=exact)
    s.add("turn1", [1, 2, 3, 4, 5])
    for _ in range(9):
        step(s)  # prompt, then 8 decodes: 5 prompt + 8 generated tokens computed
    s.finish("turn1")
    chunk = first_chunk(s, "turn2", [1, 2, 3, 4, 5] + [99] * 9 + [5, 6])
    assert chunk.start == start


def test_held_route_keys_follow_the_cached_chain_most_recent_first():
    s = make(num_blocks=6, block_size=4)
    first_chunk(s, "a", list(range(9)), keys=[b"sys", b"a1"])
    first_chunk(s, "b", [40 + i for i in range(5)], keys=[b"b1"])
    # Running ones newest first, a request's chained keys deepest first (as NullBackend lists them).
    assert s.held_keys(10) == [b"b1", b"a1", b"sys"]
    s.finish("b")
    s.finish("a")
    assert s.held_keys(10) == [b"a1", b"sys", b"b1"] and s.held_keys(1) == [b"a1"]
    first_chunk(s, "c", [70 + i for i in range(20)])  # evicts every cached block
    s.finish("c")
    assert s.held_keys(10) == []


def test_without_caching_nothing_is_reused_and_every_freed_block_is_empty():
    s = Scheduler(num_blocks=8, block_size=4, prefill_chunk=64, max_running=2)
    first_chunk(s, "a", list(range(10)))
    s.finish("a")
    assert first_chunk(s, "b", list(range(10))).start == 0 and s.pool.cached == 0


def test_a_block_released_twice_is_an_error():
    pool = BlockPool(2)
    block = pool.allocate()
    pool.release([block])
    with pytest.raises(ValueError, match="released more often"):
        pool.release([block])


def test_addresses_chain_the_prefix_and_the_graph():
    a = chain_hashes(b"graph", [1, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(a) == 2 and a[0] == chain_hashes(b"graph", [1, 2, 3, 4], 4)[0]
    assert chain_hashes(b"graph", [9, 9, 9, 9, 5, 6, 7, 8], 4)[1] != a[1]  # same tokens, other prefix
    assert chain_hashes(b"other model", [1, 2, 3, 4], 4)[0] != a[0]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=14), st.integers(1, 8)),
                min_size=1, max_size=8),
       st.integers(3, 10), st.integers(1, 3), st.integers(2, 9), st.randoms(use_true_random=False))
def test_the_pool_stays_consistent_and_every_sequence_reads_its_own_tokens(
        requests, num_blocks, block_size, chunk, rng):
    """Prompts over three token ids share prefixes often. A simulated KV cache records which token
    each block position holds: every chunk must find its own sequence's tokens at every earlier
    position in its block table (reused blocks included), refs count the tables holding a block,
    no block in use is free, and empty + cached + in use = the pool."""
    s = Scheduler(num_blocks=num_blocks, block_size=block_size, prefill_chunk=chunk, max_running=3,
                  caching=True, seed=b"g")
    kv: dict[tuple[int, int], int] = {}
    want, seqs, generated = {}, {}, {}
    for i, (prompt, new) in enumerate(requests):
        s.add(str(i), prompt)
        want[str(i)], seqs[str(i)], generated[str(i)] = new, list(prompt), 0
    for _ in range(3000):
        if not len(s):
            break
        plan = s.plan()
        for c in plan.chunks:
            tokens = seqs[c.seq_id]
            for pos in range(c.start):  # what the pass reads
                assert kv[c.blocks[pos // block_size], pos % block_size] == tokens[pos]
            for pos, token in enumerate(c.tokens, c.start):  # what it writes
                assert s.pool.refs(c.blocks[pos // block_size]) == 1  # never into a shared block
                kv[c.blocks[pos // block_size], pos % block_size] = token
        s.commit()
        check_accounting(s)
        for c in plan.chunks:
            if not c.sample:
                continue
            generated[c.seq_id] += 1
            if generated[c.seq_id] >= want[c.seq_id] or rng.random() < 0.1:
                s.finish(c.seq_id)
            else:
                token = rng.randrange(3)
                seqs[c.seq_id].append(token)
                s.append(c.seq_id, token)
    assert not len(s) and s.free_blocks == num_blocks
    check_accounting(s)


def check_accounting(s: Scheduler) -> None:
    pool = s.pool
    tables = [seq.blocks for seq in s._running]
    in_use = {b for table in tables for b in table}
    empty, cached = set(pool._empty), set(pool._lru)
    assert not (in_use & empty) and not (in_use & cached) and not (empty & cached)
    assert len(empty) == len(pool._empty)  # no block twice in the empty list
    assert len(in_use) + len(empty) + len(cached) == pool.num_blocks
    for b in range(pool.num_blocks):
        assert pool.refs(b) == sum(table.count(b) for table in tables) >= 0
    assert all(b in pool._address for b in cached)


def test_a_pool_records_no_events_unless_asked():
    pool = BlockPool(1)  # no publisher: no block's tokens are copied for one
    block = pool.allocate()
    pool.register(block, b"a" * 16, None, [1, 2])
    pool.release([block])
    block = pool.allocate()  # evicts a
    pool.register(block, b"b" * 16, b"a" * 16, [3, 4])
    assert pool.drain() == [] and pool.evictions == 1 and not pool.events
    pool.release([block])
    pool.recording = True  # a publisher now exists
    pool.register(pool.allocate(), b"c" * 16, None, [5, 6])  # evicts b
    assert pool.drain() == [Removed(b"b" * 16), Stored(b"c" * 16, None, (5, 6))]
