"""One generation: prefill a prompt, then sample, stream and stop, one forward pass per ``step()``.

A Generation owns a Session (its own InferRequest and KV cache), so a worker can interleave several;
it hands the session back through ``release`` when closed. Text goes through the tokenizer's
StreamDecoder (never a broken UTF-8 sequence) and a StopMatcher (never emits a stop string).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ovpool.completion import Completion, Delta, TokenLogprobs, Usage
from ovpool.errors import InvalidRequestError
from ovpool.sampling_params import SamplingParams
from ovpool.worker.generate.constraint import Constraint
from ovpool.worker.generate.limits import context_note
from ovpool.worker.generate.logprobs import Logprobs
from ovpool.worker.generate.plan import prompt_chunk
from ovpool.worker.generate.sampler import Sampler, StopMatcher
from ovpool.worker.generate.session import Session
from ovpool.worker.text.tool_reader import ToolReader

log = logging.getLogger("ovpool.worker")


class Generation:
    """Generate from ``prompt_ids`` with ``params``. Use as a context manager, or call ``close()``."""

    def __init__(self, session: Session | None, release: Callable[[Session], None] | None,
                 prompt_ids: Sequence[int], params: SamplingParams, tokenizer, *, context_length: int,
                 prefill_chunk: int | None = None, constraint: Constraint | None = None,
                 tools: ToolReader | None = None):
        self._session, self._release = session, release
        self.prompt_ids, self.params = list(prompt_ids), params
        # A session may keep the KV of the prompt's beginning (Engine.prefix_cache): not recomputed.
        self.cached = session.past if session is not None else 0
        self._pending = self.prompt_ids[self.cached:]
        self._chunk = max(prefill_chunk or len(self._pending), 2)  # see prompt_chunk
        self._context_length = context_length
        self._eos = frozenset() if params.ignore_eos else frozenset(tokenizer.eos_ids)
        self._sampler = Sampler(params, self.prompt_ids)
        self._logprobs = None if params.logprobs is None else Logprobs(tokenizer, params.logprobs)
        self._token_logprobs: list[TokenLogprobs] = []
        self._sent_logprobs = 0  # how many of them a Delta carried
        self.constraint = constraint
        self._tools = tools  # reads the reply's tool calls out of its text
        self._decoder = tokenizer.stream_decoder()
        self._stop = StopMatcher(params.stop)
        self.token_ids: list[int] = []
        self._last: int | None = None  # the token last chosen (EOS too)
        self._text: list[str] = []
        self.finish_reason: str | None = None
        self.note = ""  # Completion.note
        self._start = time.perf_counter()
        self._stamps: list[float] = []

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def step(self) -> Delta | None:
        """One forward pass: a prompt chunk, or the next token. None when there is no new text."""
        if self.finished:
            return None
        if self._pending:
            n = prompt_chunk(len(self._pending), self._chunk)  # the batcher's chunks, too
            chunk, self._pending = self._pending[:n], self._pending[n:]
            logits = self._session.forward(chunk, logits_from=len(chunk) - 1)
            if self._pending:
                return None
        else:
            logits = self._session.forward(self.token_ids[-1:], logits_from=0)
        return self.feed(logits[-1])

    def feed(self, logits: np.ndarray, masked: bool = False) -> Delta | None:
        """Sample the next token from its logits [vocab] (from any forward pass) and accept it;
        ``masked``: the constraint's mask is already applied (a batched pass masks all its rows).

        A Generation driven from outside (a batched forward pass) is built with session=None.
        """
        if self.constraint is not None:
            logits = logits if masked else self.constraint.masked(logits)
            self.constraint.check()  # a mask past llguidance's limits fails the request
        token = self._last = self._sampler.choose(logits)
        if self._logprobs is not None and token not in self._eos:
            self._token_logprobs.append(self._logprobs.of(logits, token))
        return self._accept(token)

    def verify(self, rows: np.ndarray, draft: Sequence[int]) -> list[Delta]:
        """Accept tokens from ``rows`` [len(draft) + 1, vocab], where row i scores the token after
        ``draft[:i]`` (prompt lookup, ovpool.worker.generate.lookup), up to the first row whose
        token is not the draft's; the Deltas with text. Each token is drawn as ``feed`` draws it,
        one draw of the seeded generator per token as without a draft, and a draft token holds
        if it is the one drawn: with probability p(d), and on rejection the token drawn is one of
        p without d, renormalised (the standard rule for a draft that is one token for sure). So
        the tokens are those of one ``feed`` per row, greedy or sampled, wherever the rows are."""
        deltas = []
        for i, row in enumerate(rows):
            delta = self.feed(row)
            if delta is not None:
                deltas.append(delta)
            if self.finished or i == len(draft) or self._last != draft[i]:
                break
        return deltas

    def __iter__(self) -> Iterator[Delta]:
        """Step to the end, yielding each Delta with new text."""
        while not self.finished:
            delta = self.step()
            if delta is not None:
                yield delta

    def _accept(self, token: int) -> Delta | None:
        self._stamps.append(time.perf_counter())
        if token in self._eos:  # not part of the completion; its delta index follows the last token
            return self._finish("stop", token, "", index=len(self.token_ids))
        self.token_ids.append(token)
        text, stopped = self._stop.feed(self._decoder.push(token))
        if stopped:
            return self._finish("stop", token, text, flush=False)
        if self.constraint is not None and self.constraint.advance(token):
            return self._finish("stop", token, text)  # complete: only EOS could follow
        if len(self.token_ids) >= self.params.max_tokens:
            return self._finish("length", token, text)
        if len(self.prompt_ids) + len(self.token_ids) >= self._context_length:
            self.note = context_note(len(self.prompt_ids), len(self.token_ids), self.params.max_tokens,
                                     self._context_length)
            log.info("a generation %s", self.note)
            return self._finish("length", token, text)
        return self._delta(token, text)

    def _finish(self, reason: str, token: int, text: str, flush: bool = True,
                index: int | None = None) -> Delta | None:
        if flush:
            tail, stopped = self._stop.feed(self._decoder.flush())
            text += tail if stopped else tail + self._stop.flush()
        self.finish_reason = reason
        self.close()
        delta = self._delta(token, text, index)
        if self._tools is not None:
            self.finish_reason = self._tools.finish_reason(reason)
        return delta

    def _delta(self, token: int, text: str, index: int | None = None) -> Delta | None:
        logprobs = tuple(self._token_logprobs[self._sent_logprobs:])
        calls = ()
        if self._tools is not None:  # the text outside the calls, and the calls' pieces
            text, calls = self._tools.feed(text, final=self.finished)
        # Without text a Delta only carries log-probabilities, at the end (else they wait for text).
        if not text and not calls and not (logprobs and self.finished):
            return None
        self._text.append(text)
        self._sent_logprobs = len(self._token_logprobs)
        return Delta(len(self.token_ids) - 1 if index is None else index, token, text, logprobs, calls)

    def completion(self) -> Completion:
        if not self.finished:
            raise InvalidRequestError("the generation has not finished: call step() until finished")
        return Completion(text="".join(self._text), token_ids=list(self.token_ids),
                          finish_reason=self.finish_reason,
                          usage=Usage(len(self.prompt_ids), len(self.token_ids), self.cached),
                          timings=self._timings(),
                          logprobs=None if self._logprobs is None else list(self._token_logprobs),
                          note=self.note, tool_calls=[] if self._tools is None else self._tools.calls,
                          stop=self._stop.matched)

    def _timings(self) -> dict[str, float]:
        first, last = self._stamps[0], self._stamps[-1]
        timings = {"ttft_s": first - self._start, "total_s": last - self._start}
        if len(self._stamps) > 1:
            timings["decode_tps"] = (len(self._stamps) - 1) / (last - first)
        return timings

    def close(self) -> None:
        """Hand the session back (idempotent); an unfinished generation ends with no completion."""
        if self._session is not None:
            session, self._session = self._session, None
            self._release(session)

    def __enter__(self) -> Generation:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
