"""Answer tails (prefix_cache=on, answer copies): near an answer's end, a pass that gives nobody's
first token also computes the partial block the answer ends in as a prompt chunk, and a later
prompt continuing that history claims it. The scheduler's and the pool's side, without OpenVINO
(the answers end to end: test_generate_prefix_cache)."""

from __future__ import annotations

from ovpool.worker.generate.answer_tails import Tail
from ovpool.worker.generate.blocks import BlockPool
from ovpool.worker.generate.scheduler import Scheduler

# 6 tokens, a full block of 4 and 2, after a shared beginning of 16 (tails are for prompts that
# continue two cached blocks or more, as a chat's turns do)
SHARED = list(range(1, 17))
PROMPTS = {"a": SHARED + list(range(10, 16)), "b": SHARED + list(range(20, 26))}


def make(tails: bool = True, block_size: int = 4) -> Scheduler:
    return Scheduler(num_blocks=64, block_size=block_size, prefill_chunk=8, max_running=4,
                     caching=True, copy_answers=True, copy_tails=tails)


def step(s: Scheduler, left: dict[str, int]):
    """One plan and its pass: a sampled chunk's sequence gets token 1000 + position, ``left[id]``
    counting down its answer's tokens; at 0 it ends."""
    plan = s.plan()
    s.commit()
    for c in plan.chunks:
        if c.sample:
            left[c.seq_id] -= 1
            if left[c.seq_id]:
                s.append(c.seq_id, 1000 + c.start + len(c.tokens), left=left[c.seq_id])
            else:
                s.finish(c.seq_id)
    return plan


def tails_of(plan, block: int = 4) -> list:
    """Copies (unsampled chunks of sequences that decode in the pass) that end inside a block."""
    decoding = {c.seq_id for c in plan.chunks if c.sample and len(c.tokens) == 1}
    return [c for c in plan.chunks
            if not c.sample and c.seq_id in decoding and (c.start + len(c.tokens)) % block]


def warm(s: Scheduler) -> None:
    """A first sequence, run to its end: its blocks cache the prompts' shared beginning."""
    s.add("w", SHARED + [17, 18])
    while s.running or s.waiting:
        step(s, {"w": 2})


def answer(s: Scheduler, answer_tokens: int = 7, prompts=PROMPTS) -> tuple[list, list[int]]:
    """``a`` and ``b`` side by side to their answers' ends, after a sequence that cached their
    shared beginning; (the plans, ``a``'s tokens but its last)."""
    warm(s)
    left = dict.fromkeys(prompts, answer_tokens)
    for rid, prompt in prompts.items():
        s.add(rid, prompt)
    history = []
    plans = []
    while s.running or s.waiting:
        history = list(s._seqs["a"].tokens) if "a" in s.running else history
        plans.append(step(s, left))
    return plans, history


def test_a_tail_is_copied_and_the_next_prompt_continues_it():
    s = make()
    plans, history = answer(s)
    tails = [c for p in plans for c in tails_of(p)]
    assert {c.seq_id for c in tails} == {"a", "b"}
    a = next(c for c in tails if c.seq_id == "a")
    end = a.start + len(a.tokens)
    assert a.start % 4 == 0 and a.tokens == history[a.start:end] and len(a.tokens) >= 2
    s.add("a2", history[:end] + [50, 51, 52])
    first = s.plan().chunks[0]
    # It starts after the tail's positions, in the tail's block (its own now, written from there).
    assert first.start == end and first.blocks[a.start // 4] == a.blocks[-1] and s.cached("a2") == end


def test_a_tail_is_copied_once_a_sequence():
    # Blocks of 8: a's last block gains positions pass after pass; it is copied once (a prompt
    # chunk's fixed cost makes small top-ups dearer than what they save), then continued whole.
    s = make(block_size=8)
    plans, history = answer(s, answer_tokens=9)
    a = [c for p in plans for c in tails_of(p, block=8) if c.seq_id == "a"]
    assert len(a) == 1 and a[0].start % 8 == 0 and len(a[0].tokens) >= 2
    end = a[0].start + len(a[0].tokens)
    s.add("a2", history[:end] + [50, 51])
    first = s.plan().chunks[0]
    assert first.start == end and first.blocks[a[0].start // 8] == a[0].blocks[-1] and s.cached("a2") == end


def test_without_tails_the_next_prompt_computes_the_partial_block():
    s = make(tails=False)
    plans, history = answer(s)
    assert not [c for p in plans for c in tails_of(p)]
    full = len(history) // 4 * 4  # prompt blocks, then answer copies
    s.add("a2", history[:full + 2] + [50, 51, 52])  # the partial block after them: computed
    assert s.plan().chunks[0].start == full and s.cached("a2") == full


def test_a_tail_serves_one_prompt_and_is_cached_again_when_let_go():
    # Two prompts resend the same history with different questions: the first claims the tail
    # (it writes the positions after it), the second computes the block itself.
    s = make()
    plans, history = answer(s)
    a = next(c for p in plans for c in tails_of(p) if c.seq_id == "a")
    end = a.start + len(a.tokens)
    s.add("x", history[:end] + [50, 51, 52])
    s.add("y", history[:end] + [60, 61, 62])
    chunks = {c.seq_id: c for c in s.plan().chunks}
    assert chunks["x"].start == end and chunks["y"].start == a.start
    assert chunks["x"].blocks[a.start // 4] != chunks["y"].blocks[a.start // 4]
    s.finish("x")  # before its pass ran: the tail's positions are untouched, cached again
    s.finish("y")
    s.add("z", history[:end] + [70, 71])
    assert s.plan().chunks[0].start == end
    s.finish("z")
    assert s.free_blocks == s.num_blocks


def test_no_tail_in_a_pass_that_gives_a_first_token_or_follows_an_end():
    # c's short answer ends while a's and b's are in their last tokens; d arrives meanwhile.
    s, left = make(), {"a": 7, "b": 7, "c": 2, "d": 2}
    warm(s)
    for rid, prompt in {**PROMPTS, "c": list(range(30, 36))}.items():
        s.add(rid, prompt)
    copied, ended_last = [], False
    for n in range(40):
        if n == 3:
            s.add("d", list(range(40, 46)))
        ended = sum(not v for v in left.values())
        plan = step(s, left)
        if tails_of(plan):
            copied.append(plan)
            assert not [c for c in plan.chunks if c.sample and len(c.tokens) > 1] and not ended_last
        ended_last = sum(not v for v in left.values()) > ended
    assert copied and not s.running


def test_a_prompt_on_one_cached_block_gets_no_tail():
    # One block cached (a chat template's shared opening): seldom a chat's turn, so a tail would
    # likely be computed for nothing.
    s = make()
    opening = SHARED[:4]
    plans, _ = answer(s, prompts={"a": opening + list(range(40, 46)), "b": opening + list(range(50, 56))})
    assert not [c for p in plans for c in tails_of(p)]


def test_claim_takes_only_a_block_nobody_holds_and_tails_are_not_announced():
    pool = BlockPool(4, events=True)
    tail = Tail(b"parent", (1, 2, 3))
    block = pool.allocate()
    assert pool.register(block, tail.address, announce=False)
    assert pool.claim(tail.address) is None  # in use: its holder may be writing it
    pool.release([block])
    assert pool.claim(tail.address) == block and not pool.holds(tail.address)
    pool.register(block, tail.address, announce=False)
    pool.release([block])
    for _ in range(4):  # evicts it, silently: a gateway's prefix index knows full blocks only
        pool.allocate()
    assert pool.evictions == 1 and pool.drain() == []
