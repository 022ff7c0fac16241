"""The prefix cache's host-RAM tier: a bounded LRU of KV blocks in the worker process, between
its KV pool and the host's disk tier (ovpool.cache.kv).

A block computed by a prompt pass goes to RAM and, written through, to disk; a sequence whose
chain the pool does not hold asks RAM first, then disk, and a block the disk gives is kept in RAM
too. A RAM hit costs one copy into the pool: no system call, no crc32 (the bytes never left the
process), against a page-cache read and a checksum for a disk hit.

Blocks live in one arena of ``budget_bytes``, cut into slots of one block each (every block of a
graph has the same size: the first block put sets it). The arena is an anonymous mapping, so a
slot takes memory only once written and the tier can never hold more than its budget, whatever
the allocator does with freed buffers. ``RamLru`` is the pure part (which address holds which
slot, least recently used out); ``RamTier`` copies bytes in and out of the arena.

Per process, not shared between a host's workers: every worker already shares the disk tier,
whose files the OS page cache keeps in RAM for all of them, so a shared-memory tier would only
save the page-cache read (~0.6 ms per SmolLM2 block) for a block another worker computed, at the
price of cross-process locking and a segment that outlives crashed workers (docs/prefix-caching.md).
"""

from __future__ import annotations

import contextlib
import mmap
import time
from collections import OrderedDict
from typing import Protocol


class LowerTier(Protocol):
    """The tier under RAM (ovpool.cache.kv.DiskTier)."""

    stats: dict

    def get(self, address: bytes, size: int) -> bytes | None: ...

    def put(self, address: bytes, payload: bytes) -> None: ...

    def flush(self, timeout: float = 30.0) -> None: ...

    def close(self) -> None: ...


class RamLru:
    """Which of ``slots`` slots holds which block address, least recently used first out."""

    def __init__(self, slots: int):
        self.slots = slots
        self._held: OrderedDict[bytes, int] = OrderedDict()
        self._free = list(range(slots - 1, -1, -1))  # popped from the end: slot 0 first
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, address: bytes) -> bool:
        return address in self._held

    def get(self, address: bytes) -> int | None:
        """The slot of ``address`` (now the most recently used), or None."""
        slot = self._held.get(address)
        if slot is not None:
            self._held.move_to_end(address)
        return slot

    def place(self, address: bytes) -> int | None:
        """A slot to write ``address``'s block into, the least recently used block evicted for it if
        none is free; None if it is held already (only made recent) or there are no slots."""
        if address in self._held:
            self._held.move_to_end(address)
            return None
        if not self._free:
            if not self._held:
                return None
            _, slot = self._held.popitem(last=False)
            self._free.append(slot)
            self.evicted += 1
        slot = self._free.pop()
        self._held[address] = slot
        return slot


class RamTier:
    """Up to ``budget_bytes`` of blocks in RAM over ``lower`` (a context manager: closing closes
    ``lower``). ``get`` returns a read-only view into the arena, valid until the next ``put``: the
    caller copies it into its pool at once (ovpool.worker.generate.kv_tier.TierLink)."""

    def __init__(self, lower: LowerTier | None, budget_bytes: int):
        self.lower, self.budget_bytes = lower, budget_bytes
        self.block_bytes: int | None = None  # set by the first block put
        self._lru: RamLru | None = None
        self._arena: mmap.mmap | None = None
        self.ram_stats = {"ram_hits": 0, "ram_read_bytes": 0, "ram_read_s": 0.0, "ram_puts": 0}

    @property
    def stats(self) -> dict:
        held = len(self._lru) if self._lru else 0
        return {**(self.lower.stats if self.lower else {}), **self.ram_stats, "ram_blocks": held,
                "ram_bytes": held * (self.block_bytes or 0),
                "ram_evicted": self._lru.evicted if self._lru else 0}

    def get(self, address: bytes, size: int) -> memoryview | bytes | None:
        start = time.perf_counter()
        slot = self._lru.get(address) if self._lru and size == self.block_bytes else None
        if slot is not None:
            self.ram_stats["ram_hits"] += 1
            self.ram_stats["ram_read_bytes"] += size
            self.ram_stats["ram_read_s"] += time.perf_counter() - start
            return memoryview(self._arena)[slot * size:(slot + 1) * size].toreadonly()
        payload = self.lower.get(address, size) if self.lower else None
        if payload is not None:
            self._keep(address, payload)
        return payload

    def put(self, address: bytes, payload: bytes) -> None:
        self._keep(address, payload)
        if self.lower is not None:
            self.lower.put(address, payload)

    def _keep(self, address: bytes, payload: bytes) -> None:
        if self._lru is None:
            self._open(len(payload))
        if len(payload) != self.block_bytes:
            return  # no block of this graph: not kept (the lower tier still has it)
        slot = self._lru.place(address)
        if slot is not None:
            self._arena[slot * self.block_bytes:(slot + 1) * self.block_bytes] = payload
            self.ram_stats["ram_puts"] += 1

    def _open(self, block_bytes: int) -> None:
        slots = self.budget_bytes // block_bytes if block_bytes else 0
        self.block_bytes, self._lru = block_bytes, RamLru(slots)
        if slots:
            self._arena = mmap.mmap(-1, slots * block_bytes)
            if hasattr(mmap, "MADV_NOHUGEPAGE"):  # a written slot faults in its own pages only
                self._arena.madvise(mmap.MADV_NOHUGEPAGE)

    def flush(self, timeout: float = 30.0) -> None:
        if self.lower is not None:
            self.lower.flush(timeout)

    def close(self) -> None:
        if self.lower is not None:
            self.lower.close()
        self._lru, arena, self._arena = None, self._arena, None
        if arena is not None:
            with contextlib.suppress(BufferError):  # a view still held: the mapping goes with it
                arena.close()

    def __enter__(self) -> RamTier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
