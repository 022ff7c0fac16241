"""Continuous batching as pure logic: which tokens of which sequences go into the next forward pass.

Every sequence is a list of token ids (prompt, then generated tokens) of which the first
``computed`` have their keys/values in the paged KV cache. ``pending = len(tokens) - computed``:
pending == 1 is a decode (one token, then sample); pending > 1 is a prompt still being prefilled
(or a preempted sequence being recomputed), fed in chunks. Each ``plan()``:

1. schedules every running decode (they never wait behind a prompt),
2. spends at most ``prefill_chunk`` tokens on prompt chunks, oldest sequence first (see
   ``prompt_chunk``: a token's keys and values are computed as in a run of its own),
3. admits waiting sequences (FIFO) while a slot, prefill budget and KV blocks are free, keeping
   one spare block per running sequence so that decodes can grow,
4. allocates the KV blocks each scheduled chunk writes. When the pool runs dry, the most recently
   admitted sequence is preempted: its blocks are freed and it waits, at the front of the queue, to
   recompute its tokens. A sequence that alone needs more blocks than the pool has is ``exhausted``.

Nothing here touches OpenVINO; ``ovpool.worker.generate.batch`` turns a Plan into a forward pass.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field


def prompt_chunk(left: int, budget: int) -> int:
    """How many of a prompt's ``left`` uncomputed tokens the next pass takes, within ``budget``
    (0: none this pass). A prompt of two or more tokens is never fed one token at a time, nor does a
    chunk leave a single token for the last one (it takes one token fewer, or one over the budget):
    OpenVINO's CPU paged attention computes a one-token query with its decode kernel and longer ones
    with its prefill kernel, which differ in the last bits at bf16 (0.11 in a tiny model's logits),
    enough to change a greedy token. So a prompt token is computed the same whether the prompt came
    whole (a run of its own) or in chunks beside other sequences."""
    if left == 1:
        return 1
    n = min(left, budget)
    if left - n == 1:
        n = n - 1 if n > 2 else left
    return n if n >= 2 else 0


@dataclass(frozen=True)
class Chunk:
    """Tokens ``tokens`` of sequence ``seq_id`` at positions ``start``..; ``blocks`` is its block table."""

    seq_id: str
    start: int
    tokens: list[int]
    blocks: list[int]
    sample: bool  # the chunk ends the known tokens: the next token is sampled from its last row


@dataclass
class Plan:
    chunks: list[Chunk] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    exhausted: list[str] = field(default_factory=list)  # cannot grow even alone: end them

    @property
    def num_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)


@dataclass
class _Seq:
    id: str
    tokens: list[int]
    prompt: int  # how many of the tokens are the prompt
    computed: int = 0
    blocks: list[int] = field(default_factory=list)

    @property
    def pending(self) -> int:
        return len(self.tokens) - self.computed

    def take(self, budget: int) -> int:
        """Tokens of the next chunk: a prompt chunk, or one generated token at a time when
        recomputing after a preemption, as each was computed the first time (see prompt_chunk)."""
        if self.computed >= self.prompt:
            return 1
        return prompt_chunk(self.prompt - self.computed, budget)


class Scheduler:
    def __init__(self, *, num_blocks: int, block_size: int, prefill_chunk: int, max_running: int):
        if num_blocks < 1 or block_size < 1 or prefill_chunk < 1 or max_running < 1:
            raise ValueError("num_blocks, block_size, prefill_chunk and max_running must be >= 1")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefill_chunk, self.max_running = prefill_chunk, max_running
        self._free: deque[int] = deque(range(num_blocks))
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []  # admission order
        self._seqs: dict[str, _Seq] = {}

    # -- sequences ---------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def fits(self, num_tokens: int) -> bool:
        """Whether a sequence of ``num_tokens`` tokens fits in the whole KV cache."""
        return self.blocks_for(num_tokens) <= self.num_blocks

    def add(self, seq_id: str, prompt: Sequence[int]) -> None:
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} is already scheduled")
        if not prompt:
            raise ValueError("a sequence needs at least one token")
        seq = _Seq(seq_id, list(prompt), len(prompt))
        self._seqs[seq_id] = seq
        self._waiting.append(seq)

    def append(self, seq_id: str, token: int) -> None:
        """The token sampled for ``seq_id`` after its last chunk: it is fed in the next plan."""
        self._seqs[seq_id].tokens.append(token)

    def finish(self, seq_id: str) -> None:
        """Forget ``seq_id`` (finished or cancelled) and free its blocks; unknown ids are ignored."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return
        if seq in self._running:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        self._release(seq)

    @property
    def running(self) -> list[str]:
        return [s.id for s in self._running]

    @property
    def waiting(self) -> list[str]:
        return [s.id for s in self._waiting]

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def __len__(self) -> int:
        return len(self._seqs)

    # -- planning ----------------------------------------------------------------------------
    def plan(self) -> Plan:
        """The next forward pass; the chunks' tokens count as computed from now on."""
        plan = Plan()
        budget = max(self.prefill_chunk, 2)  # a prompt chunk has two tokens or more (prompt_chunk)
        for seq in [s for s in self._running if s.pending == 1]:
            if seq in self._running:  # not preempted by an earlier decode of this loop
                self._schedule(seq, 1, plan)
        for seq in [s for s in self._running if s.pending > 1]:
            if budget > 0 and seq in self._running and (n := seq.take(budget)):
                budget -= self._schedule(seq, n, plan)
        while budget > 0 and self._waiting and len(self._running) < self.max_running:
            seq = self._waiting[0]
            if not self.fits(len(seq.tokens)):
                self._exhaust(seq, plan)
                continue
            n = seq.take(budget)
            if not n or self.blocks_for(seq.computed + n) + len(self._running) > len(self._free):
                break
            self._running.append(self._waiting.popleft())
            budget -= self._schedule(seq, n, plan)
        return plan

    def _schedule(self, seq: _Seq, n: int, plan: Plan) -> int:
        """Add ``n`` tokens of ``seq`` to ``plan`` (allocating, preempting if needed); tokens added."""
        if not self._grow(seq, seq.computed + n, plan):
            return 0
        end = seq.computed + n
        plan.chunks.append(Chunk(seq.id, seq.computed, seq.tokens[seq.computed:end], list(seq.blocks),
                                 sample=end == len(seq.tokens)))
        seq.computed = end
        return n

    def _grow(self, seq: _Seq, num_tokens: int, plan: Plan) -> bool:
        need = self.blocks_for(num_tokens) - len(seq.blocks)
        if not self.fits(num_tokens):
            self._exhaust(seq, plan)
            return False
        while need > len(self._free):
            victim = self._running[-1]
            self._preempt(victim, plan)
            if victim is seq:
                return False
        seq.blocks.extend(self._free.popleft() for _ in range(need))
        return True

    def _preempt(self, seq: _Seq, plan: Plan) -> None:
        self._running.remove(seq)
        self._release(seq)
        seq.computed = 0
        self._waiting.appendleft(seq)
        plan.preempted.append(seq.id)
        # A preempted sequence may already have a chunk in this plan: it is recomputed anyway.
        plan.chunks[:] = [c for c in plan.chunks if c.seq_id != seq.id]

    def _exhaust(self, seq: _Seq, plan: Plan) -> None:
        self.finish(seq.id)
        plan.exhausted.append(seq.id)

    def _release(self, seq: _Seq) -> None:
        # Reused first (last in, first out): blocks never written cost no memory (batch.PagedRunner),
        # so a long-running worker touches only as many as its busiest moment needed.
        self._free.extendleft(reversed(seq.blocks))
        seq.blocks = []
