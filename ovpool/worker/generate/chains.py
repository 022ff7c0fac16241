"""Sequences' content-addressed block chains: what admission reuses and what a pass makes shareable.

With prefix caching the paged pool's blocks are content-addressed (ovpool.worker.generate.blocks):
a sequence is admitted on the longest chain of cached full blocks its tokens begin with (continued
from a lower tier, ovpool.worker.generate.kv_tier, when there is one) and computes only the rest;
once a pass has run, the full blocks it computed get their addresses (``register``), and full
prompt blocks are saved to the tier. Pure logic over the pool, like the scheduler that owns it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ovpool.worker.generate.blocks import BlockPool, chain_hashes
from ovpool.worker.generate.plan import Seq


class Chains:
    """The chains of sequences in ``pool``; ``seed``: the first block's parent address; ``exact``:
    only blocks computed as the new sequence would compute them (see blocks.chain_hashes);
    ``tier``: the lower tier (TierLink) or None; ``tails``: answer tails (AnswerTails) or None."""

    def __init__(self, pool: BlockPool, seed: bytes, block_size: int, exact: bool, tier=None, tails=None):
        self.pool, self.seed, self.block_size, self.exact, self.tier = pool, seed, block_size, exact, tier
        self.tails = tails

    def addresses(self, seq: Seq, blocks: int | None = None) -> list[bytes]:
        return chain_hashes(self.seed, seq.tokens, self.block_size, seq.addresses, blocks,
                            prompt=seq.prompt if self.exact else None)

    def computing(self, running: Iterable[Seq]) -> set[bytes]:
        """The addresses of the prompt blocks running prefills are still to compute: a waiting
        prompt that begins with one waits for it rather than computing it too."""
        if not self.pool.caching:
            return set()
        return {a for s in running if s.computed < s.prompt
                for a in s.addresses[s.registered:s.prompt // self.block_size]}

    def reuse(self, seq: Seq, spare: int) -> None:
        """Start ``seq`` (not computed) on the longest chain of cached blocks its tokens begin with,
        but always computing at least its last token (to sample from it) and never a prompt's last
        token alone (see plan.prompt_chunk): a block fewer when the chain ends there. ``spare``:
        blocks a tier load leaves free (one per running sequence)."""
        if not self.pool.caching or seq.blocks:
            return
        seq.addresses = self.addresses(seq)
        n = self.pool.longest(seq.addresses)
        while n and not seq.resumable(n * self.block_size):
            n -= 1
        seq.blocks = [self.pool.take(a) for a in seq.addresses[:n]]
        if self.tier is not None:
            self._load(seq, spare)
        n = len(seq.blocks)
        seq.computed, seq.registered = n * self.block_size, n
        if self.tails is not None:  # and the positions of a tail after them
            seq.computed += self.tails.claim(seq, seq.addresses[n - 1] if n else self.seed)

    def release(self, seq: Seq) -> None:
        """``seq`` lets go of its blocks (a tail it claimed is cached again)."""
        if self.tails is not None:
            self.tails.release(seq)
        self.pool.release(seq.blocks)

    def _load(self, seq: Seq, spare: int) -> None:
        """Continue ``seq``'s cached chain with blocks from the lower tier, as far as it holds them,
        ``resumable`` allows and more than ``spare`` blocks stay free."""
        for address in seq.addresses[len(seq.blocks):]:
            if not seq.resumable((len(seq.blocks) + 1) * self.block_size) or self.pool.available <= spare:
                return
            block = self.pool.take(address)
            if block is None:
                payload = self.tier.fetch(address)
                if payload is None:  # a miss: no block allocated, so no cached one evicted
                    return
                block = self.pool.allocate()
                self.tier.fill(block, payload)
                self.pool.register(block, address, *self._content(seq, len(seq.blocks)))
            seq.blocks.append(block)

    def register(self, seq: Seq) -> None:
        """``seq``'s last pass has run: the full blocks it computed get their content addresses
        (not before: a block is only shared once its keys and values are written)."""
        full = seq.computed // self.block_size
        if self.exact and seq.verified is not None:  # a verifying pass's KV is no decode's
            full = min(full, seq.verified // self.block_size)
        seq.addresses = self.addresses(seq, full)
        for i in range(seq.registered, full):
            self.pool.register(seq.blocks[i], seq.addresses[i], *self._content(seq, i))
            if self.tier is not None and (i + 1) * self.block_size <= seq.prompt:
                self.tier.save(seq.addresses[i], seq.blocks[i])
        seq.registered = max(seq.registered, full)

    def _content(self, seq: Seq, i: int) -> tuple[bytes | None, Sequence[int]]:
        """Block ``i``'s parent address and tokens, as BlockPool.register reports them."""
        begin = i * self.block_size
        return (seq.addresses[i - 1] if i else None), seq.tokens[begin:begin + self.block_size]
