"""Prompt-lookup (n-gram) speculation as pure logic: what to propose, and whether it pays.

``NgramIndex`` holds one sequence's tokens (prompt, then generated) and proposes the tokens that
followed the latest earlier occurrence of its longest suffix n-gram (n from ``max_n`` down to
``min_n``), as GenAI's prompt-lookup decoding and vLLM's ngram proposer do: text that copies its
input (a summary quoting it, code with a rename, a list repeated) continues as it did before. The
index is updated incrementally: a proposal costs ``max_n`` dictionary look-ups, not a scan.

``Speculation`` decides, per sequence, how many of the proposed tokens a pass verifies. It
estimates the chance that a proposed token is the one the model picks, apart for each length of
the matched n-gram (a 3-gram's proposal holds far more often than a 1-gram's), from every
proposal, also those it did not verify (the next token shows whether the proposal's first token
was right, at no cost), and verifies ``k`` tokens only where ``(1 + expected accepted tokens) /
cost`` beats a one-position pass. ``PassCost`` is that cost, timed as the passes run: by positions,
and what a change of the pass's shape adds (both ways: into a verifying streak and back), which
makes verifying sticky: a streak starts only where it pays for both changes.
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

    def propose(self, k: int) -> tuple[int, list[int]]:
        """(n, ``k`` tokens): the tokens after the latest earlier occurrence of the longest suffix
        n-gram, repeated where that occurrence ends within ``k`` of the history's end (a history
        repeating a span goes on repeating it); (0, []) without one."""
        size = len(self.tokens)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            end = self._ends.get(tuple(self.tokens[size - n:]))
            if end is not None:
                return n, repeated(self.tokens[end:end + k], k)
        return 0, []


def repeated(span: Sequence[int], k: int) -> list[int]:
    """``k`` tokens: ``span`` over and over."""
    return [span[i % len(span)] for i in range(k)]


def propose(tokens: Sequence[int], k: int, min_n: int = 1, max_n: int = 3) -> tuple[int, list[int]]:
    """``NgramIndex(tokens).propose(k)``, by a scan: the reference its tests compare it with."""
    tokens = list(tokens)
    for n in range(min(max_n, len(tokens)), min_n - 1, -1):
        suffix = tokens[len(tokens) - n:]
        for end in range(len(tokens) - 1, n - 1, -1):
            if tokens[end - n:end] == suffix:
                return n, repeated(tokens[end:end + k], k)
    return 0, []


class PassCost:
    """The time of a pass over ``n`` positions of one sequence, in one-position passes, on this
    host's class and load: the ratio of moving averages (~1/``weight`` passes each) of passes of
    the previous pass's shape, as ``observe`` times them. A size not timed within the last
    ``forget`` one-position passes costs, for now, what the largest smaller size timed costs: a
    pass over more positions costs no less, and so an untimed size is tried, and timed (a slow
    spell's figure would otherwise stop the speculation that could time it again). ``switch``: what
    a pass whose shape differs from the previous pass's costs more (OpenVINO's CPU plugin prepares
    every node again on a new input shape: docs/prompt-lookup.md), timed as such passes run;
    ``last``: the previous pass's positions (0: not timed, e.g. a batch)."""

    def __init__(self, switch: float = 0.3, weight: float = 0.1, forget: int = 256):
        self.weight, self.forget = weight, forget
        self.switch, self.last = switch, 0
        self._seconds: dict[int, float] = {}  # positions -> moving average of a same-shape pass's seconds
        self._seen: dict[int, int] = {}  # positions -> one-position passes timed before its last
        self._ones = 0

    def __call__(self, n: int) -> float:
        if n <= 1 or 1 not in self._seconds:
            return 1.0
        if self._stale(n):
            return max((self(m) for m in range(2, n) if not self._stale(m)), default=1.0)
        return self._seconds[n] / self._seconds[1]

    def _stale(self, n: int) -> bool:
        return self._ones - self._seen.get(n, -self.forget) >= self.forget

    def observe(self, n: int, seconds: float) -> None:
        """A pass over ``n`` positions of one sequence took ``seconds``."""
        if n == self.last:
            mean = self._seconds.get(n)
            fresh = mean is None or (n > 1 and self._stale(n))
            self._seconds[n] = seconds if fresh else mean + self.weight * (seconds - mean)
            self._ones += n == 1
            self._seen[n] = self._ones
        elif 1 in self._seconds and n in self._seconds and (n == 1 or not self._stale(n)):
            extra = max(seconds - self._seconds[n], 0.0) / self._seconds[1]
            self.switch += self.weight * (extra - self.switch)
        self.last = n


# The prior chance that a proposal's tokens are right, by the matched n-gram's length (1, 2, 3+):
# in free text their first tokens held 0.23 / 0.27, 0.52 / 0.74 and 0.81 / 0.95 of the time
# (SmolLM2 / gemma3, benchmarks/prompt_lookup.py's open-ended prompts; docs/performance.md).
PRIORS = (0.25, 0.5, 0.8)


class Speculation:
    """One sequence's speculation: ``mode`` on (always verify what is proposed, up to ``k``
    tokens) or auto (only as many as pay, by ``cost``); ``rates[n][i]``: the chance that token i of
    a proposal that matched an n-gram is right once those before it were, a prior (``priors``,
    by n), then a moving average over its last ~1/``weight`` outcomes (the first token's is seen on
    every proposal, verified or not: later ones hold less often, so one rate for all had verified
    too far)."""

    def __init__(self, tokens: Sequence[int], *, k: int, mode: str = "auto", cost: PassCost | None = None,
                 priors: Sequence[float] = PRIORS, weight: float = 0.15, min_n: int = 1, max_n: int = 3):
        self.index = NgramIndex(tokens, min_n=min_n, max_n=max_n)
        self.k, self.mode, self.weight = k, mode, weight
        self.rates = {n: [priors[min(n, len(priors)) - 1]] * k for n in range(min_n, max_n + 1)}
        self.cost = PassCost() if cost is None else cost
        self._match = 0  # the n-gram length of the last proposal
        self._guess: int | None = None  # the first token of the last unverified proposal
        self._verifying = False  # the last pass verified a draft
        self.proposed = self.accepted = self.passes = 0  # verified draft tokens, accepted ones, passes

    def draft(self, most: int) -> list[int]:
        """The tokens (``most`` at most) the next pass verifies after the sequence's last token."""
        self._match, proposal = self.index.propose(min(self.k, most)) if most > 0 else (0, [])
        rates = self.rates.get(self._match, [])
        n = len(proposal) if self.mode == "on" else self._worth(rates, len(proposal))
        self._guess = proposal[0] if proposal and not n else None
        return proposal[:n]

    def _worth(self, rates: Sequence[float], most: int) -> int:
        """How many proposed tokens (of ``most``) a pass best verifies; 0: one position is best.
        A pass whose shape is not the previous pass's pays ``cost.switch``; one that starts a
        streak of verifying passes also pays for the switch back (a streak starts only where it
        pays for both); one position never does (that was paid when the streak started)."""
        best, gain, expected, p = 0, 1.0, 1.0, 1.0
        for n in range(1, most + 1):
            p *= rates[n - 1]
            expected += p  # the tokens a pass verifying n proposed tokens gives, on average
            price = self.cost(n + 1) + self.cost.switch * ((n + 1 != self.cost.last) + (not self._verifying))
            if expected / price > gain:
                best, gain = n, expected / price
        return best

    def accept(self, draft: Sequence[int], tokens: Sequence[int]) -> None:
        """The pass that verified ``draft`` (maybe none) gave ``tokens``: extend the history, and
        learn how often proposals are right."""
        rates = self.rates.get(self._match, [])
        if draft:
            right = agreeing(draft, tokens)
            self.passes, self.proposed, self.accepted = (self.passes + 1, self.proposed + len(draft),
                                                         self.accepted + right)
            for i in range(right):
                self._learn(rates, i, 1.0)
            if right < len(draft) and right < len(tokens):
                self._learn(rates, right, 0.0)
        elif self._guess is not None and tokens:
            self._learn(rates, 0, 1.0 if tokens[0] == self._guess else 0.0)
        self._guess, self._verifying = None, bool(draft)
        self.index.extend(tokens)

    def _learn(self, rates: list[float], i: int, outcome: float) -> None:
        rates[i] += self.weight * (outcome - rates[i])


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
        else:
            self.cost.last = 0  # a pass of another shape, not timed

    def accept(self, seq_id: str, draft: Sequence[int], tokens: Sequence[int]) -> None:
        if seq_id in self._seqs:
            self._seqs[seq_id].accept(draft, tokens)
