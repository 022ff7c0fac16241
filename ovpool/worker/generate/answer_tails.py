"""An answer's partial last block, computed as a prompt chunk near the answer's end, for a chat's
next turn (prefix_cache=on with answer copies; pure logic over the pool).

Answer copies (answer_copies.py) cover an answer's full blocks; the block it ends in is partial, and
a chat's next turn computed its positions again (half a block a turn on average). In the last passes
of an answer (``Seq.left``: the Batcher knows max_tokens; which passes: AnswerCopies), the block's
positions so far are computed once more as a prompt chunk over the exact chain before them, into a
block of its own, cached as a *tail*: its parent's address and its tokens; a later pass extends the
same block by the positions since (two at least). A later sequence
whose tokens continue that chain ``claim``s the tail sharing the longest common prefix with them:
the block becomes its own (a claimed tail serves one sequence) and it writes the positions after
that prefix. A position's keys and values depend on the tokens up to it only, and a prompt pass
computes them the same wherever its chunk starts (plan.prompt_chunk: never one token alone), so the
answers are those without the cache (tests/test_generate_prefix_cache.py). A claimed tail is cached
again when its sequence lets go of the block before filling it (``release``).

vLLM caches full blocks only (a partial block is recomputed); llama.cpp's server keeps a slot's
cache up to the longest common prefix with the next prompt, whatever its block. A tail is the latter
inside a block pool, exact because its KV comes from a prompt pass, like the blocks before it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ovpool.worker.generate.blocks import BlockPool

_PER_PARENT = 4  # tails kept after one parent block (a chat's history has one)


@dataclass(frozen=True)
class Tail:
    """The first ``len(tokens)`` positions of a block after the full block addressed ``parent``."""

    parent: bytes
    tokens: tuple[int, ...]

    @property
    def address(self) -> bytes:  # its own domain: a tail never aliases a full block's address
        data = np.asarray(self.tokens, np.int64).tobytes()
        return hashlib.blake2b(data, key=self.parent[:64], digest_size=16, person=b"ovpool-tail").digest()


@dataclass(frozen=True)
class Claim:
    """Block ``index`` of a sequence's table is the claimed ``tail`` (its positions still valid)."""

    index: int
    tail: Tail


class AnswerTails:
    """Tails in ``pool``, looked up by parent address (``seed``: the first block's parent); at most
    ``limit`` parents indexed, the least recently stored forgotten first."""

    def __init__(self, pool: BlockPool, seed: bytes, block_size: int, limit: int):
        self.pool, self.seed, self.block_size, self.limit = pool, seed, block_size, limit
        self._tails: OrderedDict[bytes, list[Tail]] = OrderedDict()
        # The copies in flight by sequence: (blocks taken, its chain's then its own; the new tail;
        # the tail it extends, or None).
        self._flights: dict[str, tuple[list[int], Tail, Tail | None]] = {}
        self._own: dict[str, Tail] = {}  # the last tail each running sequence copied

    def next_chunk(self, seq, chain: Sequence[bytes], reserve: int) -> tuple[int, list, list] | None:
        """(start, tokens, block table) of ``seq``'s tail copy, its blocks taken, or None (fewer
        than two new positions, its chain not all cached, its tail already in flight, no more than
        ``reserve`` blocks free). ``chain``: the exact addresses of its full blocks so far. Its
        last tail, if still cached in this block, is extended in place: only the positions after it."""
        full = len(seq.tokens) // self.block_size
        start = full * self.block_size
        if seq.id in self._flights or len(chain) < full:
            return None
        tail = Tail(chain[full - 1] if full else self.seed, tuple(seq.tokens[start:]))
        old = self._own.get(seq.id)
        if old is None or old.parent != tail.parent or not self.pool.holds(old.address):
            old = None  # none, or the answer left its block, or someone continued it
        done = len(old.tokens) if old is not None else 0
        if len(tail.tokens) - done < 2 or (old is None and self.pool.available - full <= reserve):
            return None
        taken = [self.pool.take(a) for a in chain[:full]]
        if None in taken:
            self.pool.release([b for b in taken if b is not None])
            return None
        held = [*taken, self.pool.claim(old.address) if old is not None else self.pool.allocate()]
        self._flights[seq.id] = held, tail, old
        return start + done, list(tail.tokens[done:]), list(held)

    def commit(self) -> None:
        """The pass with the copies in flight has run: cache their tails."""
        for seq_id, (held, tail, _) in self._flights.items():
            self._store(held[-1], tail)
            self._own[seq_id] = tail
            self.pool.release(held)
        self._flights.clear()

    def drop(self) -> None:
        """Hand back the copies in flight's blocks (their pass did not run: a tail one extended
        is cached again as it was)."""
        for held, _, old in self._flights.values():
            if old is not None:
                self._store(held[-1], old)
            self.pool.release(held)
        self._flights.clear()

    def forget(self, seq_id: str) -> None:
        """``seq_id`` ended: its tail stays cached, for whoever continues it."""
        self._own.pop(seq_id, None)

    def claim(self, seq, parent: bytes) -> int:
        """Give ``seq`` (starting after its full cached blocks, ``parent`` the last one's address)
        the cached tail after ``parent`` that shares the most of its prompt, as its next block;
        how many positions it covers (0: none). ``seq`` still computes two prompt tokens at least
        (plan.prompt_chunk)."""
        start = len(seq.blocks) * self.block_size
        limit, ahead = seq.prompt - start - 2, seq.tokens[start:start + self.block_size]
        best, n = None, 0
        for tail in [t for t in self._tails.get(parent, ()) if self.pool.holds(t.address)]:
            common = next((i for i, (a, b) in enumerate(zip(tail.tokens, ahead, strict=False)) if a != b),
                          min(len(tail.tokens), len(ahead)))
            if min(common, limit) > n:
                best, n = tail, min(common, limit)
        block = self.pool.claim(best.address) if best is not None else None
        if block is None:
            return 0
        self._tails[parent].remove(best)
        seq.blocks.append(block)
        seq.claim = Claim(len(seq.blocks) - 1, Tail(parent, best.tokens[:n]))
        return n

    def release(self, seq) -> None:
        """``seq`` lets go of its blocks: a tail it claimed is cached again unless it filled the
        block (then a full block's address holds it)."""
        if seq.claim is not None and seq.claim.index < len(seq.blocks):
            self._store(seq.blocks[seq.claim.index], seq.claim.tail)
        seq.claim = None

    def _store(self, block: int, tail: Tail) -> None:
        if not self.pool.register(block, tail.address, announce=False):
            return
        tails = [t for t in self._tails.pop(tail.parent, []) if self.pool.holds(t.address)]
        self._tails[tail.parent] = [*tails[1 - _PER_PARENT:], tail]
        while len(self._tails) > self.limit:
            self._tails.popitem(last=False)
