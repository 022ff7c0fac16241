"""An answer's partial last block, computed as a prompt chunk near the answer's end, for a chat's
next turn (prefix_cache=on with answer copies; pure logic over the pool).

Answer copies (answer_copies.py) cover an answer's full blocks; the block it ends in is partial, and
a chat's next turn computed its positions again (half a block a turn on average). In the last passes
of an answer (``Seq.left``: the Batcher knows max_tokens; which pass: AnswerCopies), the block's
positions so far are computed once more as a prompt chunk over the exact chain before them, into a
block of its own, cached as a *tail*: its parent's address and its tokens. A later sequence whose
tokens continue that chain ``claim``s the tail sharing the longest common prefix with them:
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
        # The copies in flight by sequence: (blocks taken, its chain's then its own; its tail).
        self._flights: dict[str, tuple[list[int], Tail]] = {}
        self._copied: set[str] = set()  # running sequences whose tail is copied: once each

    def next_chunk(self, seq, chain: Sequence[bytes], reserve: int) -> tuple[int, list, list] | None:
        """(start, tokens, block table) of ``seq``'s tail copy, its blocks taken, or None (copied
        already, fewer than two positions, its chain not all cached, no more than ``reserve``
        blocks free). ``chain``: the exact addresses of its full blocks so far. Once a sequence:
        growing a tail in small steps costs more than it saves (a prompt chunk's fixed cost,
        docs/performance.md)."""
        full = len(seq.tokens) // self.block_size
        start = full * self.block_size
        if seq.id in self._copied or len(seq.tokens) - start < 2 or len(chain) < full \
                or self.pool.available - full <= reserve:
            return None
        tail = Tail(chain[full - 1] if full else self.seed, tuple(seq.tokens[start:]))
        taken = [self.pool.take(a) for a in chain[:full]]
        if None in taken:
            self.pool.release([b for b in taken if b is not None])
            return None
        held = [*taken, self.pool.allocate()]
        self._flights[seq.id] = held, tail
        self._copied.add(seq.id)
        return start, list(tail.tokens), list(held)

    def commit(self) -> None:
        """The pass with the copies in flight has run: cache their tails."""
        for held, tail in self._flights.values():
            self._store(held[-1], tail)
            self.pool.release(held)
        self._flights.clear()

    def drop(self) -> None:
        """Hand back the copies in flight's blocks uncached (their pass did not run)."""
        for held, _ in self._flights.values():
            self.pool.release(held)
        self._flights.clear()

    def forget(self, seq_id: str) -> None:
        """``seq_id`` ended: its tail stays cached, for whoever continues it."""
        self._copied.discard(seq_id)

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
