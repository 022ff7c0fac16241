"""The paged KV pool's blocks as pure logic: reference counts, content addresses, LRU eviction.

A block is in one of three states:

- in use: ``refs > 0``, held by one or more sequences' block tables; never evicted;
- cached: ``refs == 0`` but it holds a full block whose content address (``chain_hash``) is known,
  so a new sequence with the same prefix can take it over without recomputing it; evicted least
  recently used first when the pool needs room;
- empty: ``refs == 0`` and nothing worth keeping.

A cached block may also hold a block's first positions only (an answer's tail,
ovpool.worker.generate.answer_tails): a sequence ``claim``s it whole, its address dropped, and
writes the positions after them; such blocks are not announced in ``events``.

``available`` (empty + cached) is what the scheduler can allocate, so the cache lives inside
``kv_cache_mb``: caching never takes a block a sequence needs. A full block's address chains the
address of everything before it (``chain_hash``), so equal addresses mean equal prefixes, and the
first one is seeded with the graph's identity, so two models never share a block.

``events`` reports what the cache gains and loses (``Stored``, ``Removed``) for a gateway's prefix
index (ovpool.worker.kv_events publishes them); a bounded outbox, filled only while ``recording``
(``BlockPool(events=True)``, or set once a publisher exists: a worker with kv_events_endpoint),
so a worker that publishes nothing copies no block's tokens.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


def chain_hash(parent: bytes, tokens: Sequence[int], prefilled: int) -> bytes:
    """The content address of a full block of ``tokens`` after the block addressed ``parent``
    (for the first block: the graph's identity), of which the first ``prefilled`` positions were
    computed by prompt passes and the others one token at a time (``chain_hashes``)."""
    data = np.asarray([*tokens, prefilled], np.int64).tobytes()
    return hashlib.blake2b(data, key=parent[:64], digest_size=16).digest()


def chain_hashes(seed: bytes, tokens: Sequence[int], block_size: int, start: Sequence[bytes] = (),
                 blocks: int | None = None, prompt: int | None = None) -> list[bytes]:
    """The addresses of the first ``blocks`` (default: every) full blocks of ``tokens``, continuing
    ``start`` (those of the first ``len(start)`` blocks, already known).

    ``prompt``: the sequence's first ``prompt`` tokens are computed by prompt passes, the others
    (generated) one at a time, with the paged op's decode kernel, whose keys and values differ
    from a prompt pass's (docs/performance.md), so the two never share a block:
    a later prompt that resends an answer (a chat's next turn) computes it again, exactly as
    without the cache. None: every position counts as a prompt's (they share)."""
    hashes = list(start)
    end = len(tokens) // block_size if blocks is None else blocks
    for i in range(len(hashes), end):
        begin = i * block_size
        prefilled = block_size if prompt is None else min(max(prompt - begin, 0), block_size)
        hashes.append(chain_hash(hashes[-1] if hashes else seed, tokens[begin:begin + block_size], prefilled))
    return hashes


@dataclass(frozen=True)
class Stored:
    """A full block with content ``address`` (after ``parent``; None: the first) is now cached."""

    address: bytes
    parent: bytes | None
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Removed:
    """The block with content ``address`` was evicted: its prefix is no longer cached here."""

    address: bytes


_EVENTS_MAX = 65536  # unread events kept (a publisher drains them every step)


class BlockPool:
    """``num_blocks`` KV blocks; ``caching=False`` keeps no content (every freed block is empty);
    ``events``: record ``Stored`` / ``Removed`` events for a publisher (``recording``)."""

    def __init__(self, num_blocks: int, caching: bool = True, events: bool = False):
        self.num_blocks, self.caching, self.recording = num_blocks, caching, events
        # Empty blocks are reused last in, first out: blocks never written cost no memory
        # (batch.PagedRunner), so a long-running worker touches only what its busiest moment needed.
        self._empty: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks
        self._address: dict[int, bytes] = {}  # block -> content address, for full computed blocks
        self._by_address: dict[bytes, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached blocks, least recently used first
        self._quiet: set[int] = set()  # blocks whose address was not announced (no Removed either)
        self.evictions = 0
        self.events: deque[Stored | Removed] = deque(maxlen=_EVENTS_MAX)

    @property
    def available(self) -> int:
        """Blocks an allocation can take: empty ones, then cached ones (evicting them)."""
        return len(self._empty) + len(self._lru)

    @property
    def cached(self) -> int:
        return len(self._lru)

    def refs(self, block: int) -> int:
        return self._refs[block]

    def holds(self, address: bytes) -> bool:
        """Whether a block with this content address is in use or cached."""
        return address in self._by_address

    def allocate(self) -> int:
        """A block for new content (refs 1): an empty one, else the least recently used cached one."""
        if self._empty:
            block = self._empty.popleft()
        else:
            block, _ = self._lru.popitem(last=False)
            self._forget(block)
            self.evictions += 1
        self._refs[block] = 1
        return block

    def _forget(self, block: int) -> None:
        address = self._address.pop(block)
        del self._by_address[address]
        if self.recording and block not in self._quiet:
            self.events.append(Removed(address))
        self._quiet.discard(block)

    def claim(self, address: bytes) -> int | None:
        """The cached block holding ``address``, now the caller's alone (refs 1, address dropped:
        the caller writes it); None if no block holds it or someone holds it."""
        block = self._by_address.get(address)
        if block is None or self._refs[block]:
            return None
        del self._lru[block]
        self._forget(block)
        self._refs[block] = 1
        return block

    def take(self, address: bytes) -> int | None:
        """The block holding ``address``, now also held by the caller (refs + 1); None if none does."""
        block = self._by_address.get(address)
        if block is not None:
            if self._refs[block] == 0:
                del self._lru[block]
            self._refs[block] += 1
        return block

    def longest(self, addresses: Iterable[bytes]) -> int:
        """How many of ``addresses`` (a chain, first block first) are held, from the first on."""
        n = 0
        for address in addresses:
            if address not in self._by_address:
                break
            n += 1
        return n

    def register(self, block: int, address: bytes, parent: bytes | None = None,
                 tokens: Sequence[int] = (), announce: bool = True) -> bool:
        """``block`` (in use) now holds the computed content ``address``, the ``tokens`` after the
        block ``parent`` (for ``events``, while ``recording`` and ``announce``); False if another
        block already holds it (two sequences computed the same prefix side by side: that one stays
        the cached copy and this one is emptied when freed) or this one has an address."""
        if not self.caching or address in self._by_address or block in self._address:
            return False
        self._address[block] = address
        self._by_address[address] = block
        if not announce:
            self._quiet.add(block)
        elif self.recording:
            self.events.append(Stored(address, parent, tuple(tokens)))
        return True

    def drain(self) -> list[Stored | Removed]:
        """The events since the last drain, oldest first."""
        out = list(self.events)
        self.events.clear()
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """The caller no longer holds ``blocks`` (a block table, first block first)."""
        # Last block first: a chain's tail is then less recently used than its head and evicted
        # before it, so a cached block's whole prefix stays cached (a chain is looked up head first).
        for block in reversed(blocks):
            self._refs[block] -= 1
            if self._refs[block] < 0:
                raise ValueError(f"block {block} released more often than taken")
            if self._refs[block] == 0:
                if block in self._address:
                    self._lru[block] = None
                else:
                    self._empty.appendleft(block)
