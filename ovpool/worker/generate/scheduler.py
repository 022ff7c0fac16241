"""Continuous batching as pure logic: which tokens of which sequences go into the next forward pass.

Sequences, chunks and plans are ovpool.worker.generate.plan's. Each ``plan()``:

1. schedules every running decode (they never wait behind a prompt),
2. spends at most ``prefill_chunk`` tokens on prompt chunks (see ``prompt_chunk``: a token's
   keys and values are computed as in a run of its own): when prompts compete, the oldest one in
   prefill keeps half the budget and the others, shortest first, take the rest; whatever they
   leave goes to the oldest. So a short prompt (or one the prefix cache made short) gets its
   first token in its first pass instead of waiting behind a long one, and no prompt starves.
   A pass finishes (gives a first token to) one more prompt only while the prompts already
   finishing in it lose less by waiting for its tokens than it would by waiting for the next
   pass (plan.PassLoad): a burst of prompts gets its first tokens a pass at a time, early,
3. admits waiting sequences (FIFO) while a slot, prefill budget and KV blocks are free, keeping
   one spare block per running sequence so that decodes can grow,
4. allocates the KV blocks each scheduled chunk writes. When the pool runs dry, the most recently
   admitted sequence is preempted: its blocks are freed and it waits, at the front of the queue, to
   recompute its tokens. A sequence that alone needs more blocks than the pool has is ``exhausted``.

With prefix caching (``caching=True``) a sequence is admitted on the cached chain its tokens begin
with and ``commit()``, once a plan's pass has run, gives the full blocks it computed their
addresses (ovpool.worker.generate.chains); freed blocks stay cached (a preempted sequence finds its
own again) until evicted.

Nothing here touches OpenVINO; ``ovpool.worker.generate.batch`` turns a Plan into a forward pass.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ovpool.worker.generate.answer_copies import AnswerCopies
from ovpool.worker.generate.answer_tails import AnswerTails
from ovpool.worker.generate.blocks import BlockPool
from ovpool.worker.generate.chains import Chains
from ovpool.worker.generate.plan import Chunk, PassLoad, Plan, Seq, prompt_chunk
from ovpool.worker.generate.route_keys import HeldKeys

__all__ = ["Chunk", "Plan", "Scheduler", "prompt_chunk"]


class Scheduler:
    """``caching``: reuse cached full blocks (prefix caching); ``exact``: only blocks computed as
    the new sequence would compute them (see blocks.chain_hashes); ``seed``: the graph's identity,
    the first block's parent address; ``tier``: a lower tier (ovpool.worker.generate.kv_tier.TierLink)
    that full prompt blocks are saved to once computed and a chain is continued from at admission;
    ``copy_answers`` (with ``caching`` and ``exact``): a pass that only decodes also computes one
    block of a decoding sequence's answer as a prompt pass would, for a chat's next turn
    (ovpool.worker.generate.answer_copies), if a block fits in ``prefill_chunk``, and ``copy_tails``
    the partial block an answer ends in (answer_tails, given ``append(left=)``); ``pass_cost``:
    a pass's fixed cost in prompt tokens' worth, ``apart``: prompts of this many tokens or more finish
    one a pass (plan.PassLoad; the measurements behind the defaults: docs/performance.md, Chat TTFT)."""

    def __init__(self, *, num_blocks: int, block_size: int, prefill_chunk: int, max_running: int,
                 caching: bool = False, exact: bool = True, seed: bytes = b"", tier=None,
                 copy_answers: bool = False, copy_tails: bool = False, pass_cost: int = 24, apart: int = 64):
        if num_blocks < 1 or block_size < 1 or prefill_chunk < 1 or max_running < 1:
            raise ValueError("num_blocks, block_size, prefill_chunk and max_running must be >= 1")
        self.num_blocks, self.block_size, self.apart = num_blocks, block_size, apart
        self.prefill_chunk, self.max_running, self.pass_cost = prefill_chunk, max_running, pass_cost
        self.pool, self.seed = BlockPool(num_blocks, caching), seed
        self.tier = tier if caching else None
        copying = caching and exact and copy_answers and block_size <= prefill_chunk
        tails = AnswerTails(self.pool, seed, block_size, num_blocks) if copying and copy_tails else None
        self.chains = Chains(self.pool, seed, block_size, exact, self.tier, tails)
        self.copies = AnswerCopies(self.pool, seed, block_size, tails) if copying else None
        self._waiting: deque[Seq] = deque()
        self._running: list[Seq] = []  # admission order
        self._seqs: dict[str, Seq] = {}
        self._planned: list[str] = []  # the sequences of the last plan, until commit()
        self._held = HeldKeys(limit=max(256, num_blocks))
        self.prompt_tokens = 0  # of admitted sequences
        self.cached_prompt_tokens = 0  # of those, taken from cached blocks

    # -- sequences ---------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def fits(self, num_tokens: int) -> bool:
        """Whether a sequence of ``num_tokens`` tokens fits in the whole KV cache."""
        return self.blocks_for(num_tokens) <= self.num_blocks

    def add(self, seq_id: str, prompt: Sequence[int], keys: Sequence[bytes] = ()) -> None:
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} is already scheduled")
        if not prompt:
            raise ValueError("a sequence needs at least one token")
        seq = Seq(seq_id, list(prompt), len(prompt), tuple(keys))
        self._seqs[seq_id] = seq
        self._waiting.append(seq)

    def append(self, seq_id: str, token: int, left: int = 0) -> None:
        """The token sampled for ``seq_id`` after its last chunk: it is fed in the next plan;
        ``left``: how many tokens it may still sample (0: unknown; answer_tails)."""
        seq = self._seqs[seq_id]
        seq.tokens.append(token)
        seq.left = left

    def decoding(self, seq_id: str) -> bool:
        """Whether ``seq_id`` runs and its next chunk is one token (a decode, which a draft may follow)."""
        seq = self._seqs.get(seq_id)
        return seq is not None and seq.admitted and seq.pending == 1 and seq.computed >= seq.prompt

    def propose(self, seq_id: str, draft: Sequence[int]) -> None:
        """Tokens the next plan verifies after ``seq_id``'s decode token, in the same chunk (as
        many as fit in free blocks: a draft never preempts a sequence)."""
        self._seqs[seq_id].draft = list(draft)

    def verified(self, seq_id: str, tokens: Sequence[int]) -> None:
        """The verifying chunk of ``seq_id``'s last plan gave ``tokens``: each but the last was
        one of its draft tokens and keeps its KV; the last is fed in the next plan. The blocks of
        the rejected draft tokens' positions go back to the pool."""
        seq = self._seqs[seq_id]
        seq.tokens.extend(tokens)
        seq.computed += len(tokens) - 1
        keep = self.blocks_for(len(seq.tokens))
        self.pool.release(seq.blocks[keep:])
        del seq.blocks[keep:]

    def finish(self, seq_id: str) -> None:
        """Forget ``seq_id`` (finished or cancelled) and free its blocks; unknown ids are ignored."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return
        if seq in self._running:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        if seq.tail is not None:
            self._held.note(seq.keys, seq.tail)
        self._release(seq)
        if self.copies is not None:
            self.copies.drop(seq_id, forget=True)

    @property
    def running(self) -> list[str]:
        return [s.id for s in self._running]

    @property
    def waiting(self) -> list[str]:
        return [s.id for s in self._waiting]

    @property
    def free_blocks(self) -> int:
        """Blocks no sequence holds (empty or cached)."""
        return self.pool.available

    def held_keys(self, limit: int) -> list[bytes]:
        """Up to ``limit`` route keys of requests whose KV chain is still in the pool, most
        recently used first: running ones (newest first), then finished ones whose last full
        block is still cached."""
        running = [(s.keys, s.tail) for s in reversed(self._running) if s.tail is not None]
        return self._held.held(running, self.pool.holds, limit)

    def cached(self, seq_id: str) -> int:
        """How many of the sequence's prompt tokens its admission found cached (0 before it)."""
        return self._seqs[seq_id].cached

    def __len__(self) -> int:
        return len(self._seqs)

    # -- planning ----------------------------------------------------------------------------
    def plan(self) -> Plan:
        """The next forward pass; the chunks' tokens count as computed from now on."""
        plan = Plan()
        for seq in [s for s in self._running if s.pending == 1]:
            if seq in self._running:  # not preempted by an earlier decode of this loop
                self._schedule_draft(seq, plan) or self._schedule(seq, 1, plan)
        self._prefill(plan)
        if self.copies is not None:
            self.copies.ride(plan, self._running)
        self._planned = list(dict.fromkeys(c.seq_id for c in plan.chunks))
        return plan

    def _prefill(self, plan: Plan) -> None:
        """Add prompt chunks to ``plan`` within the prefill budget (PassLoad), admitting waiting
        sequences. Shortest first (a prefix-cache hit or a short prompt is one chunk from its first
        token), within what the oldest prompt in prefill leaves: it keeps half the budget (all of
        it alone), counted first and scheduled last, so none starves. New prompts shorter than
        every other one in prefill go first, the others after them."""
        budget = max(self.prefill_chunk, 2)  # a prompt chunk has two tokens or more (prompt_chunk)
        prefilling = [s for s in self._running if s.pending > 1]
        oldest = prefilling[0] if prefilling else None
        alone = oldest is None or (len(prefilling) == 1 and not self._waiting)
        load, first, held = PassLoad(budget, self.pass_cost, self.apart), 0, 0
        if oldest is not None:
            first = oldest.take(budget if alone else max(budget // 2, 2))
            load.add(first, first == oldest.pending, oldest.prompt)
            held = self.blocks_for(oldest.computed + first) - len(oldest.blocks)
        others = sorted(prefilling[1:], key=lambda s: s.pending)
        if others:
            self._admit(plan, load, over=False, held=held, shorter=others[0].pending)
        for seq in others:
            if seq in self._running and (n := self._fit(seq, load, over=False)):
                self._add(seq, n, plan, load)
        self._admit(plan, load, over=oldest is None, held=held)
        if oldest is not None and oldest in self._running:
            n = oldest.take(first + max(load.room, 0))
            if n == oldest.pending and n > first and not load.finishes(n - first, oldest.prompt):
                n = first  # finishing it too would make the prompts finishing here wait longer
            self._schedule(oldest, n, plan)

    def _add(self, seq: Seq, n: int, plan: Plan, load: PassLoad) -> None:
        """Schedule ``n`` tokens of ``seq`` and count them in ``load``."""
        finishes = n == seq.pending
        added = self._schedule(seq, n, plan)
        load.add(added, finishes and added > 0, seq.prompt)

    def _fit(self, seq: Seq, load: PassLoad, over: bool) -> int:
        """How many tokens of ``seq``'s next chunk ``load`` takes (0: none): within its room, and
        if the chunk ends the prompt, only as PassLoad.finishes allows. ``over``: a chunk may take
        one token over the room (prompt_chunk)."""
        n = seq.take(max(load.room, 0))
        if not 0 < n <= load.room + over or (n == seq.pending and not load.finishes(n, seq.prompt)):
            return 0
        return n

    def _admit(self, plan: Plan, load: PassLoad, over: bool, held: int, shorter: int | None = None) -> None:
        """Admit waiting sequences (FIFO, but those whose next block a running prefill computes)
        into ``plan`` while ``load`` takes their chunks (_fit), a slot and KV blocks last (but
        ``held``, the blocks the oldest prompt's chunk needs) and, given ``shorter``, while they
        have fewer tokens to compute."""
        computing = self.chains.computing(self._running)
        for seq in list(self._waiting):
            if load.room <= 0 or len(self._running) >= self.max_running:
                break
            if not self.fits(len(seq.tokens)):
                self._exhaust(seq, plan)
                continue
            self.chains.reuse(seq, spare=len(self._running) + 1)
            if seq.registered < len(seq.addresses) and seq.addresses[seq.registered] in computing:
                self._release(seq)  # its next block is being computed: it takes it from the cache
                continue
            n = self._fit(seq, load, over)
            need = self.blocks_for(seq.computed + n) - len(seq.blocks)
            if (not n or (shorter is not None and seq.pending >= shorter)
                    or need + held + len(self._running) > self.pool.available):
                self._release(seq)  # its cached blocks go back, as they were
                break
            self._waiting.remove(seq)
            self._running.append(seq)
            self._count(seq)
            self._add(seq, n, plan, load)

    def commit(self) -> None:
        """The last plan's pass has run: the full blocks it computed get their content addresses
        (not before: a block is only shared once its keys and values are written)."""
        for seq_id in self._planned:
            seq = self._seqs.get(seq_id)
            if seq is None or seq not in self._running:
                continue
            self.chains.register(seq)
            if self.copies is not None:
                self.copies.commit(seq_id)
        self._planned = []

    def _count(self, seq: Seq) -> None:
        if not seq.admitted:
            seq.admitted, seq.cached = True, min(seq.computed, seq.prompt)
            self.prompt_tokens += seq.prompt
            self.cached_prompt_tokens += seq.cached

    def _schedule(self, seq: Seq, n: int, plan: Plan) -> int:
        """Add ``n`` tokens of ``seq`` to ``plan`` (allocating, preempting if needed); tokens added."""
        if not self._grow(seq, seq.computed + n, plan):
            return 0
        end = seq.computed + n
        plan.chunks.append(Chunk(seq.id, seq.computed, seq.tokens[seq.computed:end], list(seq.blocks),
                                 sample=end == len(seq.tokens)))
        seq.computed = end
        return n

    def _schedule_draft(self, seq: Seq, plan: Plan) -> bool:
        """Add ``seq``'s decode token and its draft (what fits in free blocks and the whole cache)
        to ``plan``; False without a draft. Only the decode token counts as computed until
        ``verified`` says which draft tokens hold."""
        draft, seq.draft = seq.draft, []
        room = min(self.pool.available - len(self._running), self.num_blocks - len(seq.blocks))
        fits = max(min((len(seq.blocks) + max(room, 0)) * self.block_size - len(seq.tokens), len(draft)), 0)
        if not fits:
            return False
        start = seq.computed
        need = self.blocks_for(start + 1 + fits) - len(seq.blocks)
        seq.blocks.extend(self.pool.allocate() for _ in range(need))
        plan.chunks.append(Chunk(seq.id, start, [seq.tokens[start], *draft[:fits]], list(seq.blocks),
                                 sample=True, draft=fits))
        seq.computed = start + 1
        seq.verified = start if seq.verified is None else seq.verified
        return True

    def _grow(self, seq: Seq, num_tokens: int, plan: Plan) -> bool:
        need = self.blocks_for(num_tokens) - len(seq.blocks)
        if not self.fits(num_tokens):
            self._exhaust(seq, plan)
            return False
        while need > self.pool.available:
            victim = self._running[-1]
            self._preempt(victim, plan)
            if victim is seq:
                return False
        seq.blocks.extend(self.pool.allocate() for _ in range(need))
        return True

    def _preempt(self, seq: Seq, plan: Plan) -> None:
        self._running.remove(seq)
        self._release(seq)  # its full blocks stay cached: it may find them again
        self._waiting.appendleft(seq)
        plan.preempted.append(seq.id)
        # A preempted sequence may already have a chunk in this plan: it is recomputed anyway.
        plan.chunks[:] = [c for c in plan.chunks if c.seq_id != seq.id]

    def _exhaust(self, seq: Seq, plan: Plan) -> None:
        self.finish(seq.id)
        plan.exhausted.append(seq.id)

    def _release(self, seq: Seq) -> None:
        if self.copies is not None:
            self.copies.drop(seq.id)
        self.chains.release(seq)
        seq.blocks, seq.computed, seq.registered, seq.verified = [], 0, 0, None

