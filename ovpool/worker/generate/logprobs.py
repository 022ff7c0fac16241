"""Log-probabilities of each output token and of the most probable alternatives at its position.

Of the raw logits (before logit_bias, penalties and temperature, vLLM's default; with a
response_format, after its mask, as vLLM's are), as log-softmax
at float32: ``(x - max) - log(sum(exp(x - max)))``, the formula NumPy and PyTorch users write.
"""

from __future__ import annotations

import numpy as np

from ovpool.completion import Logprob, TokenLogprobs

# The alternatives are looked for among the logits within this much of the best one first (about
# a hundred tokens of a 49k vocabulary, docs/performance.md); fewer than asked for there means a
# look at all of them.
_WINDOW = np.float32(9.2)


class Logprobs:
    """Makes one sequence's TokenLogprobs, ``top`` alternatives each (0..20), the token texts from
    ``tokenizer``."""

    def __init__(self, tokenizer, top: int):
        self._tokenizer, self._top = tokenizer, top
        self._work: np.ndarray | None = None  # reused: see Sampler._buffers

    def of(self, logits: np.ndarray, token: int) -> TokenLogprobs:
        """``token``'s log-probability and the top alternatives' under ``logits`` [vocab]."""
        x = np.asarray(logits, dtype=np.float32)
        if self._work is None or self._work.shape != x.shape:
            self._work = np.empty(x.shape, np.float32)
        best = x.max()
        log_total = np.log(np.exp(np.subtract(x, best, out=self._work), out=self._work).sum())
        ids = self._top_ids(x, best) if self._top else []
        return TokenLogprobs(self._logprob(x, best, log_total, token),
                             tuple(self._logprob(x, best, log_total, int(i)) for i in ids))

    def _top_ids(self, x: np.ndarray, best: np.float32) -> np.ndarray:
        """The ``top`` most probable ids, most probable first, ties by the lower id."""
        top = self._top
        ids = np.flatnonzero(x >= best - _WINDOW)
        if len(ids) < top:
            ids = np.flatnonzero(x >= np.partition(x, -top)[-top])
            ids = ids[x[ids] > -np.inf]  # a token a response_format forbids is no alternative
        elif len(ids) > top:  # a flat row holds thousands: keep those at least the top-th (ties too)
            values = x[ids]
            ids = ids[values >= np.partition(values, len(ids) - top)[len(ids) - top]]
        return ids[np.argsort(-x[ids], kind="stable")[:top]]

    def _logprob(self, x: np.ndarray, best: np.float32, log_total: np.float32, token: int) -> Logprob:
        text = self._tokenizer.piece(token, skip_special=False).decode("utf-8", errors="replace")
        return Logprob(token, text, float((x[token] - best) - log_total))
