"""Steps 1-3 of SamplingParams' order on one sequence's logits: logit_bias, then the repetition
penalty (prompt and output tokens), then the frequency and presence penalties (output tokens)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ovpool.sampling_params import SamplingParams


class Penalties:
    """The bias and penalties of one sequence; ``accept`` each output token. Float32 throughout,
    as vLLM computes them: the tests compare with the same formulas in NumPy."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int]):
        self._bias_ids = np.array([t for t, _ in params.logit_bias], np.int64)
        self._bias = np.array([b for _, b in params.logit_bias], np.float32)
        self._repetition = np.float32(params.repetition_penalty)
        self._presence = np.float32(params.presence_penalty)
        self._frequency = np.float32(params.frequency_penalty)
        # Every token seen (prompt and output) as an array, rebuilt only when one joins; the
        # output's counts (a few hundred distinct tokens at most: rebuilt every step).
        self._seen = set(prompt_ids) if params.repetition_penalty != 1.0 else None
        self._seen_ids = np.array(sorted(self._seen or ()), np.int64)
        self._counts: dict[int, int] | None = \
            {} if params.presence_penalty != 0.0 or params.frequency_penalty != 0.0 else None
        self._x: np.ndarray | None = None

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """A penalized float32 copy of ``logits`` [vocab] (the input, a graph's output buffer, stays),
        valid until the next call: the copy reuses one array (see Sampler._buffers)."""
        if self._x is None or self._x.shape != logits.shape:
            self._x = np.empty(logits.shape, np.float32)
        x = self._x
        np.copyto(x, logits)
        if len(self._bias_ids):
            x[self._bias_ids] += self._bias
        if len(self._seen_ids):
            v = x[self._seen_ids]
            x[self._seen_ids] = np.where(v > 0, v / self._repetition, v * self._repetition)
        if self._counts:
            ids = np.fromiter(self._counts, np.int64, len(self._counts))
            counts = np.fromiter(self._counts.values(), np.float32, len(self._counts))
            x[ids] = x[ids] - self._frequency * counts - self._presence
        return x

    def accept(self, token: int) -> None:
        if self._seen is not None and token not in self._seen:
            self._seen.add(token)
            self._seen_ids = np.append(self._seen_ids, token)
        if self._counts is not None:
            self._counts[token] = self._counts.get(token, 0) + 1
