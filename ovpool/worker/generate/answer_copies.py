"""Prompt-pass copies of a decoding sequence's full blocks, so that a chat's next turn finds its
last answer cached, exactly (prefix_cache=on; pure logic, like the scheduler it serves).

A generated token's keys and values come from a one-token pass, which differs in the last bits
from the same token in a prompt pass (docs/prefix-caching.md), so its block never serves a prompt:
a chat's next turn, which resends the answer, computed it again while its user waited for the first
token. Instead, while a sequence decodes, each full block past its prompt's full blocks is computed
once more as a prompt chunk (over the prompt-pass blocks before it) into a block of its own, which
is cached under the address a prompt's block gets. The next turn starts on it, bit for bit what it
would have computed itself; the work is the same, moved from the next turn's first pass into passes
that only decode (one block a pass, so a decode step grows by at most one block's prefill). Only
answers a next turn likely resends are copied (``AnswerCopies.continued``).

A copy holds no block between passes: once computed it is an ordinary cached block (evicted least
recently used first, so a copy never makes room for itself by preempting anyone), and the next
copy takes the chain again; a chain evicted meanwhile ends that sequence's copies. The block an
answer ends in is partial: answer_tails copies it in the pass that decodes the answer's last token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ovpool.worker.generate.answer_tails import AnswerTails
from ovpool.worker.generate.blocks import BlockPool, chain_hash
from ovpool.worker.generate.plan import Chunk, Plan

# A tail is copied in a pass that gives no first token while its answer has at most this many
# tokens left to sample: chat_sim.py's replay, docs/performance.md.
TAIL_WINDOW = 8
# An answer is copied when its prompt began on this many cached blocks (AnswerCopies.continued).
CONTINUED_BLOCKS = 2


@dataclass
class _Copies:
    addresses: list[bytes] = field(default_factory=list)  # copied blocks past the prompt's full ones
    held: list[int] = field(default_factory=list)  # blocks taken for the pass in flight, new one last
    parent: bytes | None = None  # the block in flight's parent address and tokens (BlockPool.register)
    tokens: Sequence[int] = ()
    ended: bool = False  # its chain was evicted


class AnswerCopies:
    """Copies of the full blocks past each running sequence's prompt blocks in ``pool``; ``seed``:
    the first block's parent address (the Scheduler's); ``tails``: answer tails too (or None)."""

    def __init__(self, pool: BlockPool, seed: bytes, block_size: int, tails: AnswerTails | None = None):
        self.pool, self.seed, self.block_size, self.tails = pool, seed, block_size, tails
        self.continued_blocks = CONTINUED_BLOCKS
        self._seqs: dict[str, _Copies] = {}
        self._ended = 0  # sequences ended since the last pass: their next turns arrive during this one

    def ride(self, plan: Plan, running: Sequence) -> None:
        """Add to a batched ``plan`` (a lone decode keeps its one-token graph) the tails of sequences
        near their answers' ends (``_tail``), and if it only decodes, one block of the oldest decoding
        sequence with a block to copy; a spare block per ``running`` sequence stays free."""
        planned, reserve = {c.seq_id for c in plan.chunks}, len(running) + 1
        only_decodes = len(plan.chunks) > 1 and all(len(c.tokens) == 1 + c.draft for c in plan.chunks)
        if self.tails is not None:
            self.tails.drop()  # a copy whose pass failed
            if len(plan.chunks) > 1:
                self._tail(plan, [s for s in running if s.id in planned], reserve)
            self._ended = 0
        for seq in (s for s in running if s.id in planned and self.continued(s)) if only_decodes else ():
            if (chunk := self.next_chunk(seq, reserve)) is not None:
                plan.chunks.append(Chunk(seq.id, *chunk, sample=False))
                return

    def _tail(self, plan: Plan, decoding: list, reserve: int) -> None:
        """Add the tail copies (answer_tails) of sequences with at most TAIL_WINDOW tokens left, in a
        pass that gives nobody's first token: none finishes a prompt in it and no sequence ended
        since the last pass (its next turn arrives during this one). In a pass that does, a copy
        would delay that turn by what it saves the next one. Only for ``continued`` sequences."""
        if self._ended or any(c.sample and len(c.tokens) > 1 + c.draft for c in plan.chunks):
            return
        for seq in (s for s in decoding if 0 < s.left <= TAIL_WINDOW and self.continued(s)):
            if chunk := self.tails.next_chunk(seq, self._chain(seq), reserve):
                plan.chunks.append(Chunk(seq.id, *chunk, sample=False))

    def continued(self, seq) -> bool:
        """Whether a next turn likely resends ``seq``'s answer, so that copies of it (full blocks and
        tail) pay: its prompt began on two cached blocks or more (a chat's history, a long shared
        system prompt), not just a chat template's shared opening. A fresh prompt is seldom
        continued, and a copy nobody continues is work for nothing (docs/performance.md)."""
        return seq.cached >= self.continued_blocks * self.block_size

    def _chain(self, seq) -> list[bytes]:
        """The exact addresses of ``seq``'s full blocks computed so far: its prompt's, then copies."""
        own, copies = seq.prompt // self.block_size, self._seqs.get(seq.id)
        done = copies.addresses[:len(copies.addresses) - bool(copies.held)] if copies else []
        return [*seq.addresses[:own], *done]

    def next_chunk(self, seq, reserve: int) -> tuple[int, list[int], list[int]] | None:
        """(start, tokens, block table) of ``seq``'s next block to copy, its blocks taken (the new
        one allocated while more than ``reserve`` blocks are free), or None: nothing to copy now.
        ``seq``: the Scheduler's, decoding (its prompt's blocks computed and addressed)."""
        copies = self._seqs.setdefault(seq.id, _Copies())
        own = seq.prompt // self.block_size  # its own blocks that a prompt pass computed
        while not copies.ended and not copies.held:
            begin, end = (own + len(copies.addresses)) * self.block_size, \
                (own + len(copies.addresses) + 1) * self.block_size
            if end > len(seq.tokens) or len(seq.addresses) < own:
                return None
            chain = [*seq.addresses[:own], *copies.addresses]
            parent = chain[-1] if chain else None
            tokens = seq.tokens[begin:end]
            address = chain_hash(parent or self.seed, tokens, self.block_size)
            if self.pool.holds(address):  # computed already (an earlier turn, another sequence)
                copies.addresses.append(address)
                continue
            if self.pool.available - len(copies.addresses) <= reserve:  # taking them may use some
                return None  # checked first: a take and release would refresh the chain's LRU place
            taken = [self.pool.take(a) for a in copies.addresses]
            if None in taken:
                self.pool.release([b for b in taken if b is not None])
                copies.ended = True
                return None
            copies.held = [*taken, self.pool.allocate()]
            copies.addresses.append(address)
            copies.parent, copies.tokens = parent, tokens
            return begin, tokens, [*seq.blocks[:own], *copies.held]
        return None

    def commit(self, seq_id: str) -> None:
        """The pass that computed ``seq_id``'s copy in flight has run: cache the copy (and a tail)."""
        if self.tails is not None:
            self.tails.commit()
        copies = self._seqs.get(seq_id)
        if copies is not None and copies.held:
            self.pool.register(copies.held[-1], copies.addresses[-1], copies.parent, copies.tokens)
            self.pool.release(copies.held)
            copies.held = []

    def drop(self, seq_id: str, forget: bool = False) -> None:
        """The pass with ``seq_id``'s copy in flight will not run (the sequence was preempted or
        ended first): hand its blocks back uncached. ``forget``: the sequence is gone."""
        copies = self._seqs.get(seq_id)
        if copies is not None and copies.held:
            copies.addresses.pop()
            self.pool.release(copies.held)
            copies.held = []
        if forget:
            self._seqs.pop(seq_id, None)
            self._ended += 1
            if self.tails is not None:
                self.tails.forget(seq_id)
