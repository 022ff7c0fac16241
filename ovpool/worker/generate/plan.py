"""What the scheduler plans and keeps per sequence: a pass's chunks, and how a prompt is cut.

Every sequence is a list of token ids (prompt, then generated tokens) of which the first
``computed`` have their keys/values in the paged KV cache. ``pending = len(tokens) - computed``:
pending == 1 is a decode (one token, then sample); pending > 1 is a prompt still being prefilled
(or a preempted sequence being recomputed), fed in chunks (``prompt_chunk``). Pure data and
arithmetic: ovpool.worker.generate.scheduler decides, ovpool.worker.generate.batch runs a Plan.
"""

from __future__ import annotations

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
    draft: int = 0  # of its tokens, the last ``draft`` are proposed ones a sampled pass verifies


@dataclass
class Plan:
    chunks: list[Chunk] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    exhausted: list[str] = field(default_factory=list)  # cannot grow even alone: end them

    @property
    def num_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)


@dataclass
class Seq:
    """A scheduled sequence: its tokens, how many are computed, and its KV blocks."""

    id: str
    tokens: list[int]
    prompt: int  # how many of the tokens are the prompt
    keys: tuple[bytes, ...] = ()  # the request's route keys (opaque, see Scheduler.held_keys)
    computed: int = 0
    blocks: list[int] = field(default_factory=list)
    addresses: list[bytes] = field(default_factory=list)  # of its tokens' full blocks, so far
    registered: int = 0  # how many of its blocks have their address in the pool
    admitted: bool = False  # once: counted in prompt_tokens
    cached: int = 0  # of its prompt's tokens, the ones its admission found cached
    draft: list[int] = field(default_factory=list)  # proposed tokens its next decode verifies
    verified: int | None = None  # the first position whose KV a verifying pass computed
    left: int = 0  # tokens it may still sample, its next decode's included (0: unknown; answer_tails)
    claim: object = None  # the cached tail its admission claimed (answer_tails.Claim)

    @property
    def tail(self) -> bytes | None:
        """The address of its last computed full block (None without one)."""
        return self.addresses[self.registered - 1] if self.registered else None

    @property
    def pending(self) -> int:
        return len(self.tokens) - self.computed

    def take(self, budget: int) -> int:
        """Tokens of the next chunk: a prompt chunk, or one generated token at a time when
        recomputing after a preemption, as each was computed the first time (see prompt_chunk)."""
        if self.computed >= self.prompt:
            return 1
        return prompt_chunk(self.prompt - self.computed, budget)

    def resumable(self, computed: int) -> bool:
        """Whether it can start at ``computed`` tokens and be computed as a run of its own would."""
        return computed < len(self.tokens) and (computed >= self.prompt or self.prompt - computed >= 2)


@dataclass
class PassLoad:
    """A pass's prompt tokens so far, within ``budget``, and how many prompts it finishes (gives
    their first token).

    Each prompt that finishes in a pass waits for the whole pass. One more finishing prompt of
    ``n`` tokens makes the ``finishing`` ones wait for its ``n`` tokens too; left to the next pass,
    it waits for that pass's fixed cost, ``fixed`` prompt tokens' worth (the weights read once a
    pass, the decodes beside it: docs/performance.md), its own tokens being computed either way.
    So it joins while ``finishing * n <= fixed``: a prompt alone, short ones several to a pass.
    A burst of prompts (a chat's later turns arriving together) gets its first tokens one after
    another rather than all after one long pass, and the chats it came from drift apart.

    Prompts of ``long`` tokens or more (a chat's history, a long shared system prompt: turns that
    come back; the Scheduler's default is two of the paged graph's 32-position blocks) finish one a
    pass, however few of their tokens are left to compute. The rule above weighs one pass: two first
    turns of ~20 tokens after a shared system prompt would share it, their answers (of one length)
    would end in one pass, and their next turns, each then computing the answer's tail too (~35
    tokens), would not: one waits a pass, and a burst of such pairs queues (``ovpool bench
    --scenario chat``'s turn 2, docs/performance.md)."""

    budget: int
    fixed: int
    long: int = 0  # 0: no prompt is kept apart
    tokens: int = 0
    finishing: int = 0
    finishing_long: int = 0

    @property
    def room(self) -> int:
        return self.budget - self.tokens

    def finishes(self, n: int, prompt: int) -> bool:
        """Whether a chunk of ``n`` tokens that ends its ``prompt``-token prompt joins (the rules above)."""
        return self.finishing * n <= self.fixed and not (self.finishing_long and self._long(prompt))

    def add(self, tokens: int, finishes: bool, prompt: int) -> None:
        """Count ``tokens`` of a ``prompt``-token prompt, a chunk that ``finishes`` it or not."""
        self.tokens += tokens
        self.finishing += finishes
        self.finishing_long += finishes and self._long(prompt)

    def _long(self, prompt: int) -> bool:
        return 0 < self.long <= prompt
