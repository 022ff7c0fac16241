"""Prompt-lookup (n-gram) speculation as pure logic: what to propose, and whether it pays.

``NgramIndex`` holds one sequence's tokens (prompt, then generated) and proposes the tokens that
followed the latest earlier occurrence of its longest suffix n-gram (n from ``max_n`` down to
``min_n``), as GenAI's prompt-lookup decoding and vLLM's ngram proposer do: text that copies its
input (a summary quoting it, code with a rename, a list repeated) continues as it did before. The
index is updated incrementally: a proposal costs ``max_n`` dictionary look-ups, not a scan.

``Speculation`` decides, per sequence, how many of the proposed tokens a pass verifies. It
estimates the chance that a proposed token is the one the model picks, from every proposal, also
those it did not verify (the next token shows whether the proposal's first token was right, at no
cost), and verifies ``k`` tokens only where ``(1 + expected accepted tokens) / cost(k + 1
positions)`` beats a one-position pass; ``PassCost`` is that cost, timed as the passes run.
``Drafts`` holds a Batcher's Speculations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence


class NgramIndex:
    """The n-grams of a token history, ``min_n`` to ``max_n`` long, each with where its latest
    occurrence that some token follows ends."""

    def __init__(self, tokens: Sequence[int] = (), *, min_n: int = 1, max_n: int = 3):
        if not 1 <= min_n <= max_n:
            raise ValueError("n-gram lengths need 1 <= min_n <= max_n")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram -> end of its latest followed occurrence
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        # The n-grams that end where ``token`` goes are followed by a token now.
        end = len(self.tokens)
        for n in range(self.min_n, min(self.max_n, end) + 1):
            self._ends[tuple(self.tokens[end - n:end])] = end
        self.tokens.append(token)

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens after the latest earlier occurrence of the longest suffix n-gram
        (none without one)."""
        size = len(self.tokens)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            end = self._ends.get(tuple(self.tokens[size - n:]))
            if end is not None:
                return self.tokens[end:end + k]
        return []


def propose(tokens: Sequence[int], k: int, min_n: int = 1, max_n: int = 3) -> list[int]:
    """``NgramIndex(tokens).propose(k)``, by a scan: the reference its tests compare it with."""
    tokens = list(tokens)
    for n in range(min(max_n, len(tokens)), min_n - 1, -1):
        suffix = tokens[len(tokens) - n:]
        for end in range(len(tokens) - 1, n - 1, -1):
            if tokens[end - n:end] == suffix:
                return tokens[end:end + k]
    return []


class PassCost:
    """The time of a pass over ``n`` positions of one sequence, in one-position passes (the decode
    graph's step): the ratio of their moving averages (~1/``weight`` passes each) as ``observe``
    times them, so what a pass costs on this host's class and load; ``base + per_token * (n - 1)``
    for a size not timed within the last ``forget`` one-position passes (a slow spell's figure
    would otherwise stop the speculation that could time it again)."""

    def __init__(self, base: float = 1.5, per_token: float = 0.15, weight: float = 0.1, forget: int = 256):
        self.base, self.per_token, self.weight, self.forget = base, per_token, weight, forget
        self._seconds: dict[int, float] = {}  # positions -> moving average of a pass's seconds
        self._seen: dict[int, int] = {}  # positions -> one-position passes timed before its last
        self._ones = 0

    def __call__(self, n: int) -> float:
        if n <= 1:
            return 1.0
        if 1 not in self._seconds or self._ones - self._seen.get(n, -self.forget) >= self.forget:
            return self.base + self.per_token * (n - 1)
        return self._seconds[n] / self._seconds[1]

    def observe(self, n: int, seconds: float) -> None:
        """A pass over ``n`` positions of one sequence took ``seconds``."""
        mean = self._seconds.get(n)
        fresh = mean is None or (n > 1 and self._ones - self._seen[n] >= self.forget)
        self._seconds[n] = seconds if fresh else mean + self.weight * (seconds - mean)
        self._ones += n == 1
        self._seen[n] = self._ones


class Speculation:
    """One sequence's speculation: ``mode`` on (always verify what is proposed, up to ``k``
    tokens) or auto (only as many as pay, by ``cost``); ``rates[i]``: the chance that a proposal's
    token i is right once those before it were, a prior ``rate``, then a moving average over its
    last ~1/``weight`` outcomes (the first token's is seen on every proposal, verified or not:
    later ones hold less often, so one rate for all had verified too far)."""

    def __init__(self, tokens: Sequence[int], *, k: int, mode: str = "auto", cost: PassCost | None = None,
                 rate: float = 0.5, weight: float = 0.15, min_n: int = 1, max_n: int = 3):
        self.index = NgramIndex(tokens, min_n=min_n, max_n=max_n)
        self.k, self.mode, self.weight = k, mode, weight
        self.rates = [rate] * k
        self.cost = PassCost() if cost is None else cost
        self._guess: int | None = None  # the first token of the last unverified proposal
        self.proposed = self.accepted = self.passes = 0  # verified draft tokens, accepted ones, passes

    def draft(self, most: int) -> list[int]:
        """The tokens (``most`` at most) the next pass verifies after the sequence's last token."""
        proposal = self.index.propose(min(self.k, most)) if most > 0 else []
        n = len(proposal) if self.mode == "on" else self._worth(len(proposal))
        self._guess = proposal[0] if proposal and not n else None
        return proposal[:n]

    def _worth(self, most: int) -> int:
        """How many proposed tokens (of ``most``) a pass best verifies; 0: one position is best."""
        best, gain, expected, p = 0, 1.0, 1.0, 1.0
        for n in range(1, most + 1):
            p *= self.rates[n - 1]
            expected += p  # the tokens a pass verifying n proposed tokens gives, on average
            if expected / self.cost(n + 1) > gain:
                best, gain = n, expected / self.cost(n + 1)
        return best

    def accept(self, draft: Sequence[int], tokens: Sequence[int]) -> None:
        """The pass that verified ``draft`` (maybe none) gave ``tokens``: extend the history, and
        learn how often proposals are right."""
        if draft:
            right = agreeing(draft, tokens)
            self.passes, self.proposed, self.accepted = (self.passes + 1, self.proposed + len(draft),
                                                         self.accepted + right)
            for i in range(right):
                self._learn(i, 1.0)
            if right < len(draft) and right < len(tokens):
                self._learn(right, 0.0)
        elif self._guess is not None and tokens:
            self._learn(0, 1.0 if tokens[0] == self._guess else 0.0)
        self._guess = None
        self.index.extend(tokens)

    def _learn(self, i: int, outcome: float) -> None:
        self.rates[i] += self.weight * (outcome - self.rates[i])


def agreeing(draft: Sequence[int], tokens: Sequence[int]) -> int:
    """How many of ``draft``'s first tokens ``tokens`` begins with."""
    n = 0
    while n < min(len(draft), len(tokens)) and draft[n] == tokens[n]:
        n += 1
    return n


class Drafts:
    """A Batcher's prompt lookup (``mode`` off, on or auto; up to ``k`` tokens a draft): a
    Speculation per request that may speculate, one PassCost for them all, and ``counts``, of its
    closed requests' drafts."""

    def __init__(self, mode: str = "off", k: int = 4, min_n: int = 1):
        self.mode, self.k, self.min_n, self.cost = mode, k, min_n, PassCost()
        self._seqs: dict[str, Speculation] = {}
        self.counts = {"passes": 0, "proposed": 0, "accepted": 0}

    def open(self, seq_id: str, tokens: Sequence[int], speculate: bool = True) -> None:
        """A sequence of ``tokens``; ``speculate`` False: never drafts for it."""
        if self.mode != "off" and speculate:
            self._seqs[seq_id] = Speculation(tokens, k=self.k, mode=self.mode, cost=self.cost,
                                             min_n=self.min_n, max_n=max(self.min_n, 3))

    def close(self, seq_id: str) -> None:
        speculation = self._seqs.pop(seq_id, None)
        if speculation is not None:
            for key in self.counts:
                self.counts[key] += getattr(speculation, key)

    def drafts(self, running: int, room: Callable[[str], int | None]) -> Iterator[tuple[str, list[int]]]:
        """(sequence, its draft) of each whose ``room`` (how many tokens it may still generate;
        None: it does not decode next) is known. ``auto`` drafts only while one sequence runs
        (``running``): 4 batched copying requests ran at 0.70x with drafts (docs/performance.md),
        their positions adding up in a pass already on the paged graph."""
        if self.mode == "auto" and running > 1:
            return
        for seq_id, speculation in self._seqs.items():
            most = room(seq_id)
            if most is not None:
                yield seq_id, speculation.draft(most - 1)

    def timed(self, seq_ids: Sequence[str], positions: int, seconds: float) -> None:
        """A pass of the sequences ``seq_ids`` over ``positions`` took ``seconds``."""
        if len(seq_ids) == 1 and seq_ids[0] in self._seqs:
            self.cost.observe(positions, seconds)

    def accept(self, seq_id: str, draft: Sequence[int], tokens: Sequence[int]) -> None:
        if seq_id in self._seqs:
            self._seqs[seq_id].accept(draft, tokens)
