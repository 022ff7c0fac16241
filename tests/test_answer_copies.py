"""Answer copies (prefix_cache=on): batched decode passes also compute a running sequence's full
blocks past its prompt as a prompt pass would, so a later prompt resending the answer starts on
them. The scheduler's side, without OpenVINO (the exactness end to end: test_generate_prefix_cache)."""

from __future__ import annotations

from ovpool.worker.generate.answer_copies import CONTINUED_BLOCKS
from ovpool.worker.generate.scheduler import Scheduler

PROMPTS = {"a": list(range(10, 16)), "b": list(range(20, 26))}  # 6 tokens: a full block, a mixed one


def make(copies: bool = True, num_blocks: int = 64, prefill_chunk: int = 8, continued: int = 0) -> Scheduler:
    """A scheduler that copies the answers of prompts that began on ``continued`` cached blocks (the
    default policy's 2 only in test_only_an_answer_a_next_turn_likely_resends_is_copied)."""
    s = Scheduler(num_blocks=num_blocks, block_size=4, prefill_chunk=prefill_chunk, max_running=4,
                  caching=True, copy_answers=copies)
    if s.copies is not None:
        s.copies.continued_blocks = continued
    return s


def step(s: Scheduler):
    """One plan and its pass: sampled chunks get token 1000 + position appended."""
    plan = s.plan()
    s.commit()
    for c in plan.chunks:
        if c.sample:
            s.append(c.seq_id, 1000 + c.start + len(c.tokens))
    return plan


def copies_of(plan) -> list:
    """The chunks of sequences that also decode in the pass."""
    decoding = {c.seq_id for c in plan.chunks if c.sample and len(c.tokens) == 1}
    return [c for c in plan.chunks if not c.sample and c.seq_id in decoding]


def decode(s: Scheduler, steps: int, prompts=PROMPTS) -> tuple[list, dict[str, list[int]]]:
    """``prompts`` side by side for ``steps`` passes; (the plans, each sequence's tokens)."""
    for rid, prompt in prompts.items():
        s.add(rid, prompt)
    plans = [step(s) for _ in range(steps)]
    return plans, {rid: list(s._seqs[rid].tokens) for rid in prompts}


def test_a_batched_decode_pass_computes_one_answer_block_as_a_prompt_chunk():
    s = make()
    plans, tokens = decode(s, 5)
    own = {rid: s._seqs[rid].blocks for rid in PROMPTS}
    made = [(i, c) for i, p in enumerate(plans) for c in copies_of(p)]
    # Block 1 (positions 4-7) of each is full once two tokens are sampled: one copy a pass, oldest first.
    assert [(i, c.seq_id, c.start) for i, c in made] == [(2, "a", 4), (3, "b", 4)]
    for i, c in made:
        assert c.tokens == tokens[c.seq_id][4:8]
        assert c.blocks[0] == own[c.seq_id][0] and c.blocks[1] not in own[c.seq_id]  # its own block
        assert all(len(o.tokens) == 1 for o in plans[i].chunks if o is not c)  # beside decodes only


def test_only_an_answer_a_next_turn_likely_resends_is_copied():
    # The default policy: prompts that began on fewer than two cached blocks (fresh ones) are not
    # copied; prompts continuing two cached blocks (a chat's history) are.
    plans, _ = decode(make(continued=CONTINUED_BLOCKS), 5)
    assert not any(copies_of(p) for p in plans)
    s = make(continued=CONTINUED_BLOCKS)
    shared = list(range(1, 9))  # two blocks of 4
    decode(s, 3, {"w": shared + [9]})
    s.finish("w")
    plans, _ = decode(s, 5, {rid: shared + prompt for rid, prompt in PROMPTS.items()})
    assert {c.seq_id for p in plans for c in copies_of(p)} == {"a", "b"}


def test_a_prompt_resending_the_answer_starts_on_the_copy():
    cached = {}
    for copies in (True, False):
        s = make(copies)
        _, tokens = decode(s, 6)
        s.finish("a")
        s.add("next", tokens["a"][:8] + [7, 7, 7])
        step(s)
        cached[copies] = s.cached("next")
    assert cached == {True: 8, False: 4}  # without: the mixed block's prompt part only is reused


def test_no_copy_beside_a_prompt_chunk_for_a_lone_decode_or_past_the_budget():
    s = make()
    plans, _ = decode(s, 4, {"a": PROMPTS["a"]})
    s.add("b", list(range(40, 60)))  # a prompt in prefill for the next passes
    plans += [step(s) for _ in range(3)]
    assert not any(copies_of(p) for p in plans)
    plans, _ = decode(make(prefill_chunk=3), 6)  # a block does not fit the prefill budget
    assert not any(copies_of(p) for p in plans)


def test_a_copy_keeps_a_spare_block_per_running_sequence_and_never_preempts():
    # Two sequences of 6 + 4 tokens: once their second blocks fill, 7 blocks leave 3 free at most,
    # the spare ones (one per running sequence, and one more); with 8, one is left for a copy.
    for num_blocks, copied in ((7, False), (8, True)):
        plans, _ = decode(make(num_blocks=num_blocks), 4)
        assert any(copies_of(p) for p in plans) == copied
        assert not any(p.preempted for p in plans)


def test_every_block_comes_back_and_an_unrun_copy_caches_nothing():
    s = make(num_blocks=16)
    for rid, prompt in PROMPTS.items():
        s.add(rid, prompt)
    for _ in range(2):
        step(s)
    plan = s.plan()  # a copy in flight, its pass never run (the sequence ends first)
    assert copies_of(plan)
    tokens = list(s._seqs["a"].tokens)
    s.finish("a")
    s.finish("b")
    assert s.free_blocks == 16
    s.add("next", tokens[:8] + [7, 7])
    step(s)
    assert s.cached("next") == 4


def test_a_sequence_whose_copied_chain_was_evicted_copies_no_further():
    s = make(num_blocks=32)
    plans, _ = decode(s, 4)  # "a" and "b" have each copied block 1
    first = s.copies._seqs["a"].addresses[0]
    taken = []
    while s.pool.holds(first):  # room made for others: the least recently used cached block goes
        taken.append(s.pool.allocate())
    s.pool.release(taken)
    plans = [step(s) for _ in range(12)]  # block 2 (positions 8-11) fills for both
    assert {c.seq_id for p in plans for c in copies_of(p)} == {"b"}
