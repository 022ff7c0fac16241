"""The sampler: greedy, penalties, temperature, top-k, top-p, min-p, seed; and stop strings.

The order of operations is SamplingParams' (its docstring). Sampling never sorts the vocabulary
by id: top-k, top-p and min-p each keep a prefix of the tokens by probability, so the candidates
are the tokens within a window of the best logit, widened only while the prefix might reach past
it, and only their values are sorted (a SIMD sort, far cheaper than a stable argsort; the window
holds a few hundred of a 49k vocabulary's tokens: docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ovpool.errors import InferenceError
from ovpool.sampling_params import SamplingParams
from ovpool.worker.generate.penalties import Penalties


class Sampler:
    """Picks the next token of one sequence from one position's logits, then the draw from its own
    seeded generator: a sequence's tokens depend only on its seed and its logits, never on the
    other sequences of a batch."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int] = ()):
        self.params = params
        # Greedy choices never draw, and a process's first np.random costs ~10 ms (its import).
        self._rng = None if self.greedy else np.random.default_rng(params.seed)
        self._penalties = Penalties(params, prompt_ids) if params.penalized else None
        self._filtered = 0 < params.top_k or params.top_p < 1 or params.min_p > 0
        self._scratch: np.ndarray | None = None

    @property
    def greedy(self) -> bool:
        return self.params.temperature == 0 or self.params.top_k == 1

    def choose(self, logits: np.ndarray) -> int:
        """The next token from ``logits`` [vocab] (left unchanged)."""
        x = logits if self._penalties is None else self._penalties.apply(logits)
        if self.greedy:
            token = _best(x)
        else:
            ids, weights, ranked = self._weights(x)
            token = self._draw(weights) if ranked is None else \
                _by_rank(ids, weights, ranked, self._draw(ranked))
        if self._penalties is not None:
            self._penalties.accept(token)
        return token

    def distribution(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tokens the next ``choose(logits)`` picks from, in id order, and their probabilities
        (float64): what the parameters define, without drawing or counting a token."""
        x = logits if self._penalties is None else self._penalties.apply(logits)
        if self.greedy:
            return np.array([_best(x)]), np.ones(1)
        ids, weights, _ = self._weights(x)
        ids = np.arange(len(weights)) if ids is None else ids
        return ids, weights / weights.sum(dtype=np.float64)

    def _weights(self, x: np.ndarray) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None]:
        """(ids in id order, their unnormalized probabilities exp(x / T - max), the same sorted
        descending) after the filters; ids None: the whole vocabulary's; ranked None: no filter."""
        scaled, work = self._buffers(len(x))
        np.divide(x, np.float32(self.params.temperature), out=scaled)
        top = scaled.max()
        _check_finite(top)  # max is NaN if any logit is
        if self._filtered:
            return self._candidates(scaled, top, work)
        return None, np.exp(np.subtract(scaled, top, out=work), out=work), None

    def _buffers(self, vocab: int) -> tuple[np.ndarray, np.ndarray]:
        """Two float32 [vocab] arrays of this sequence's, reused every step: a fresh 196 KiB array
        is a fresh mmap whose pages fault in, which cost 4-10x the arithmetic on them (49k
        vocabulary: 100-400 us per step instead of ~40)."""
        if self._scratch is None or self._scratch.shape[1] != vocab:
            self._scratch = np.empty((2, vocab), np.float32)
        return self._scratch[0], self._scratch[1]

    def _candidates(self, scaled: np.ndarray, top: np.float32, work: np.ndarray) -> tuple:
        """The ids that survive top-k, top-p and min-p (None: all do), their weights, and the
        weights sorted descending."""
        p, vocab = self.params, len(scaled)
        k = p.top_k if p.top_k < vocab else 0
        # The nucleus of the whole vocabulary needs its whole mass; after top-k, only the k's.
        everything, total = None, None
        if p.top_p < 1 and not k:
            everything = np.exp(np.subtract(scaled, top, out=work), out=work)
            total = everything.sum()
        for window, floor in _WINDOWS:
            ids = _window(scaled, top, window, k)  # with top-k the first window always decides
            weights = np.exp(scaled[ids] - top) if everything is None else everything[ids]
            ranked = np.sort(weights)[::-1]
            n = _kept(ranked, k, p.top_p, p.min_p, total, floor)
            if n is not None:
                return (None, weights, ranked) if n == vocab else \
                    (*_prefix(ids, weights, ranked[n - 1], n), ranked[:n])
        raise AssertionError("the whole vocabulary always decides")

    def _draw(self, weights: np.ndarray) -> int:
        """Inverse-CDF draw of an index into ``weights`` in two levels (blocks, then within one
        block): a float64 cumsum over 49k weights costs 270-440 us, more than the rest of
        sampling together."""
        starts = np.arange(0, len(weights), _DRAW_BLOCK)
        block_cdf = np.cumsum(np.add.reduceat(weights, starts), dtype=np.float64)
        u = self._rng.random() * block_cdf[-1]
        b = min(int(np.searchsorted(block_cdf, u, side="right")), len(starts) - 1)
        within = np.cumsum(weights[starts[b]:starts[b] + _DRAW_BLOCK], dtype=np.float64)
        rest = u - (block_cdf[b - 1] if b else 0.0)
        return int(starts[b]) + min(int(np.searchsorted(within, rest, side="right")), len(within) - 1)


def _best(x: np.ndarray) -> int:
    """The greedy choice: the id of the best logit, checked (argmax finds a NaN or +inf first)."""
    token = int(np.argmax(x))
    _check_finite(x[token])
    return token


def _check_finite(best: np.float32) -> None:
    """Fail a row whose best logit is not finite, which would otherwise pick token 0 or fail deep
    in the filters: NaN or +inf is a device or graph fault (a precision the plugin computes
    wrongly), -inf a row that excludes every token."""
    if np.isfinite(best):  # every token's case: one comparison
        return
    if best == -np.inf:
        raise InferenceError("no token can come next: every token of the vocabulary is excluded")
    raise InferenceError(f"the model computed non-finite logits ({best}) for this request: the "
                         "device's arithmetic failed; run it at inference_precision=f32 or on "
                         "another device")


_DRAW_BLOCK = 256
# Candidate windows below the best scaled logit, with the weight exp(-window) no token outside
# reaches (plus rounding): e >= 1e-4, e >= 1e-8, then the whole vocabulary.
_WINDOWS = ((9.2, 1.02e-4), (18.4, 1.02e-8), (np.inf, 0.0))


def _window(scaled: np.ndarray, top: np.float32, window: float, k: int) -> np.ndarray:
    """The ids within ``window`` of the best scaled logit (all of them for an infinite one); with
    top-k, exactly those at least the k-th best (ties included)."""
    if window == np.inf:
        return np.arange(len(scaled))
    ids = np.flatnonzero(scaled >= top - window)
    if not k or len(ids) == k:
        return ids
    if len(ids) < k:  # a peaked row: one partition, O(vocab), rather than a wider window
        return np.flatnonzero(scaled >= np.partition(scaled, len(scaled) - k)[len(scaled) - k])
    values = scaled[ids]  # a flat row holds thousands: sort only the k best
    return ids[values >= np.partition(values, len(ids) - k)[len(ids) - k]]


def _kept(ranked: np.ndarray, k: int, top_p: float, min_p: float, total: np.float32 | None,
          floor: float) -> int | None:
    """How many of the candidates (their weights ``ranked`` descending, the best one's 1) survive
    top-k, then top-p (of ``total``, the whole vocabulary's mass, or of the top k's), then min-p;
    None when tokens outside the candidates (each below ``floor``) might survive too."""
    n = min(len(ranked), k) if k else len(ranked)
    if top_p < 1:
        mass = np.cumsum(ranked[:n])
        target = np.float32(top_p) * (mass[-1] if total is None else total)
        if mass[-1] < target and floor > 0:
            return None  # the nucleus reaches past the window
        n = min(n, int(np.searchsorted(mass, target)) + 1)
    elif not k and min_p < floor:
        return None  # min-p alone: tokens outside the window could pass it
    if min_p > 0:
        n = min(n, int(np.count_nonzero(ranked[:n] >= np.float32(min_p))))
    return n


def _by_rank(ids: np.ndarray | None, weights: np.ndarray, ranked: np.ndarray, rank: int) -> int:
    """The id of the ``rank``-th most probable kept token (ties by the lower id). Draws go down
    the ranking, not up the ids: a token's place in the CDF then moves only with the tokens more
    probable than it, so logits a rounding apart (bf16 batched vs alone) rarely change a draw."""
    value = ranked[rank]
    among_equal = rank - int(np.count_nonzero(ranked[:rank] > value))
    index = int(np.flatnonzero(weights == value)[among_equal])
    return index if ids is None else int(ids[index])


def _prefix(ids: np.ndarray, weights: np.ndarray, cut: np.float32, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The n most probable of ``ids`` (in id order), the n-th's weight being ``cut``: all above
    it, and of those equal to it the lowest ids."""
    keep = weights >= cut
    extra = int(np.count_nonzero(keep)) - n
    if extra:
        keep[np.flatnonzero(weights == cut)[-extra:]] = False
    return ids[keep], weights[keep]


class StopMatcher:
    """Cuts generated text at the first stop string, across token boundaries: text that could
    still become a stop string is held back until it cannot; the stop string is never emitted."""

    def __init__(self, stop: tuple[str, ...]):
        self.stop = tuple(s for s in stop if s)
        self._longest = max((len(s) for s in self.stop), default=0)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string reached

    def feed(self, text_delta: str) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop string was reached)."""
        if self.stopped:
            return "", True
        text = self._held + text_delta
        # The stop that completes first wins (as it would token by token), the longest on a tie.
        hits = [(i + len(s), i, s) for s in self.stop if (i := text.find(s)) >= 0]
        if hits:
            _, start, self.matched = min(hits)
            self._held, self.stopped = "", True
            return text[:start], True
        hold = self._partial_suffix(text)
        self._held = text[len(text) - hold:]
        return text[:len(text) - hold], False

    def flush(self) -> str:
        """The held-back text, when generation ended without reaching a stop string."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest end of ``text`` that is a proper prefix of some stop string."""
        for n in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0
