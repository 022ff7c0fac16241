"""A worker's KV pool over a lower tier: full prompt blocks copied out once computed, and back in
for a sequence whose chain the pool no longer (or never) held.

The tier is handed in (the worker's RAM tier over the host's disk tier, ovpool.cache.kv_ram and
ovpool.cache.kv, which the engine opens: generation never reaches the cache itself); all it needs
is ``get(address, size)``, a buffer or None (a RAM hit is a view into the tier, copied into the
pool at once; ``size``: the runner's ``block_bytes``; the tier reads no more than one block's
bytes, and a file of another size is no block) and ``put(address, bytes)``. Only blocks whose
every position a prompt pass computed go down (``prefix_cache=on``'s exact rule:
ovpool.worker.generate.blocks.chain_hashes), so a block loaded back holds the bytes the new
sequence's own prompt pass would have written.
"""

from __future__ import annotations

import time
from typing import Protocol


class BlockTier(Protocol):
    def get(self, address: bytes, size: int) -> bytes | memoryview | None: ...

    def put(self, address: bytes, payload: bytes) -> None: ...


class BlockCopier(Protocol):
    """The KV tensors' side (ovpool.worker.generate.batch.PagedRunner)."""

    block_bytes: int

    def read_block(self, block: int) -> bytes: ...

    def write_block(self, block: int, data: bytes) -> None: ...


class TierLink:
    """``tier`` under the blocks of ``runner``; counts the blocks it moved, and the seconds that
    loading them took (the tier's read and the copy into the pool: benchmarks/kv_tier.py)."""

    def __init__(self, tier: BlockTier, runner: BlockCopier):
        self.tier, self.runner = tier, runner
        self.loaded = self.saved = 0
        self.load_s = 0.0

    def fetch(self, address: bytes) -> bytes | None:
        """The tier's copy of ``address``, or None if it has none (the tier is asked for
        ``block_bytes`` bytes: a block of another size, which no address of this graph can name,
        is none). Asked before a block is allocated for it, so a miss evicts nothing."""
        start = time.perf_counter()
        payload = self.tier.get(address, self.runner.block_bytes)
        self.load_s += time.perf_counter() - start
        if payload is None or len(payload) != self.runner.block_bytes:
            return None
        return payload

    def fill(self, block: int, payload: bytes) -> None:
        """Write ``payload`` (from ``fetch``) into ``block``."""
        start = time.perf_counter()
        self.runner.write_block(block, payload)
        self.load_s += time.perf_counter() - start
        self.loaded += 1

    def save(self, address: bytes, block: int) -> None:
        """Copy ``block`` (just computed, full, all prompt) down to the tier."""
        self.tier.put(address, self.runner.read_block(block))
        self.saved += 1
