"""Prompt-pass copies of a decoding sequence's full blocks, so that a chat's next turn finds its
last answer cached, exactly (prefix_cache=on; pure logic, like the scheduler it serves).

A generated token's keys and values come from a one-token pass, which differs in the last bits
from the same token in a prompt pass (docs/prefix-caching.md), so its block never serves a prompt:
a chat's next turn, which resends the answer, computed it again while its user waited for the first
token. Instead, while a sequence decodes, each full block past its prompt's full blocks is computed
once more as a prompt chunk (over the prompt-pass blocks before it) into a block of its own, which
is cached under the address a prompt's block gets. The next turn starts on it, bit for bit what it
would have computed itself; the work is the same, moved from the next turn's first pass into passes
that only decode (one block a pass, so a decode step grows by at most one block's prefill).

A copy holds no block between passes: once computed it is an ordinary cached block (evicted least
recently used first, so a copy never makes room for itself by preempting anyone), and the next
copy takes the chain again; a chain evicted meanwhile ends that sequence's copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ovpool.worker.generate.blocks import BlockPool, chain_hash


@dataclass
class _Copies:
    addresses: list[bytes] = field(default_factory=list)  # copied blocks past the prompt's full ones
    held: list[int] = field(default_factory=list)  # blocks taken for the pass in flight, new one last
    parent: bytes | None = None  # the block in flight's parent address and tokens (BlockPool.register)
    tokens: Sequence[int] = ()
    ended: bool = False  # its chain was evicted


class AnswerCopies:
    """Copies of the full blocks past each running sequence's prompt blocks in ``pool``; ``seed``:
    the first block's parent address (the Scheduler's)."""

    def __init__(self, pool: BlockPool, seed: bytes, block_size: int):
        self.pool, self.seed, self.block_size = pool, seed, block_size
        self._seqs: dict[str, _Copies] = {}

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
        """The pass that computed ``seq_id``'s copy in flight has run: cache the copy."""
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
