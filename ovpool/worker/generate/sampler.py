"""The sampler: greedy, temperature, top-k, top-p, seed, stop strings."""

from __future__ import annotations

import numpy as np

from ovpool.sampling_params import SamplingParams


class Sampler:
    """Picks the next token from one position's logits: temperature, then top-k, then top-p over
    the tempered distribution (Hugging Face's order), then a draw from the seeded generator.

    Argsorts only a partitioned head of the vocabulary: per-token cost stays well under a
    millisecond on a 49k vocabulary (benchmarks/tokenizer_speed.py).
    """

    def __init__(self, params: SamplingParams):
        self.params = params
        # Greedy choices never draw, and a process's first np.random costs ~10 ms (its import).
        self._rng = None if self.greedy else np.random.default_rng(params.seed)

    @property
    def greedy(self) -> bool:
        return self.params.temperature == 0 or self.params.top_k == 1

    def choose(self, logits: np.ndarray) -> int:
        if self.greedy:
            return int(np.argmax(logits))
        p = self.params
        scaled = np.asarray(logits, dtype=np.float32) / np.float32(p.temperature)
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        keep = self._candidates(probs)
        if keep is None:
            return self._draw(probs)
        return int(keep[self._draw(probs[keep])])

    def _candidates(self, probs: np.ndarray) -> np.ndarray | None:
        """Token ids that survive top-k and top-p; None: all of them."""
        p, vocab = self.params, len(probs)
        k = p.top_k if 0 < p.top_k < vocab else vocab
        if k < vocab or p.top_p >= 1.0:
            if k == vocab:
                return None
            head = _top_sorted(probs, k)
            return head[:_nucleus_size(probs[head], p.top_p)]   # relative to what top-k kept
        head = _top_sorted(probs, min(_NUCLEUS_HEAD, vocab))
        n = _nucleus_size(probs[head], p.top_p, total=1.0)
        if n <= len(head):
            return head[:n]
        # A flat distribution whose nucleus is wider than the head: sorting the values alone is
        # several times cheaper than an argsort, and the threshold is all top-p needs.
        values = np.sort(probs)[::-1]
        n = min(_nucleus_size(values, p.top_p, total=1.0), vocab)
        return np.flatnonzero(probs >= values[n - 1])

    def _draw(self, probs: np.ndarray) -> int:
        """Inverse-CDF draw in two levels (blocks, then within one block): a float64 cumsum over
        the whole vocabulary costs more than the rest of sampling together."""
        starts = np.arange(0, len(probs), _DRAW_BLOCK)
        block_cdf = np.cumsum(np.add.reduceat(probs, starts), dtype=np.float64)
        u = self._rng.random() * block_cdf[-1]
        b = min(int(np.searchsorted(block_cdf, u, side="right")), len(starts) - 1)
        within = np.cumsum(probs[starts[b]:starts[b] + _DRAW_BLOCK], dtype=np.float64)
        rest = u - (block_cdf[b - 1] if b else 0.0)
        return int(starts[b]) + min(int(np.searchsorted(within, rest, side="right")), len(within) - 1)


_DRAW_BLOCK = 256
_NUCLEUS_HEAD = 512


def _nucleus_size(sorted_probs: np.ndarray, top_p: float, total: float | None = None) -> int:
    """How many of the most probable tokens it takes to reach ``top_p`` of the mass (at least one;
    more than the array holds when it does not get there)."""
    mass = np.cumsum(sorted_probs)
    return int(np.searchsorted(mass, top_p * (mass[-1] if total is None else total))) + 1


def _top_sorted(probs: np.ndarray, size: int) -> np.ndarray:
    head = np.argpartition(probs, -size)[-size:] if size < len(probs) else np.arange(len(probs))
    # Stable, so equal probabilities keep one order on every run.
    return head[np.argsort(-probs[head], kind="stable")]


class StopMatcher:
    """Cuts generated text at the first stop string, across token boundaries: text that could
    still become a stop string is held back until it cannot; the stop string is never emitted."""

    def __init__(self, stop: tuple[str, ...]):
        self.stop = tuple(s for s in stop if s)
        self._longest = max((len(s) for s in self.stop), default=0)
        self._held = ""
        self.stopped = False

    def feed(self, text_delta: str) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop string was reached)."""
        if self.stopped:
            return "", True
        text = self._held + text_delta
        # The stop that completes first wins (as it would token by token), the longest on a tie.
        hits = [(i + len(s), i) for s in self.stop if (i := text.find(s)) >= 0]
        if hits:
            self._held, self.stopped = "", True
            return text[:min(hits)[1]], True
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
