"""NullBackend: a Backend without a model (tokens derived from the seed and prompt, an optional
per-step delay), so the broker, worker and client can be tested and benchmarked without OpenVINO.
A request that may call tools gets calls instead (``_calls``), streamed in pieces."""

from __future__ import annotations

import math
import random
import time
import zlib
from collections import OrderedDict
from collections.abc import Sequence

from ovpool.completion import Completion, Delta, Logprob, TokenLogprobs, Usage
from ovpool.sampling_params import SamplingParams
from ovpool.tools import ToolCall, ToolCallDelta, new_call_id
from ovpool.worker.backend import PromptOrMessages, check_room
from ovpool.worker.events import Event, Finished, Token
from ovpool.worker.generate.limits import check_logit_bias, check_prompt_length


class _NullSession:
    def __init__(self, prompt_tokens: int, params: SamplingParams, text: str):
        self.params = params
        self.prompt_tokens = prompt_tokens
        # crc32, unlike hash(), is the same in every process: same seed and prompt, same tokens.
        self.rng = random.Random((params.seed or 0) ^ zlib.crc32(text.encode()))
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprobs] = []
        self.started = time.perf_counter()
        self.calls = _calls(params)
        # One piece a step: each call's id and name, then its arguments in two halves.
        self.pieces = [p for i, c in enumerate(self.calls) for p in (
            ToolCallDelta(i, c.id, c.name, ""), ToolCallDelta(i, "", "", c.arguments[:1]),
            ToolCallDelta(i, "", "", c.arguments[1:]))]


def _calls(params: SamplingParams) -> list[ToolCall]:
    """The chosen tool (named), else the first; with "required" and parallel calls, one of each
    of the first two; arguments ``{}``."""
    if not params.calls_tools:
        return []
    tools = params.tools
    if isinstance(params.tool_choice, dict):
        tools = [t for t in tools if t["name"] == params.tool_choice["name"]]
    many = params.tool_choice == "required" and params.parallel_tool_calls
    return [ToolCall(new_call_id(), t["name"], "{}") for t in tools[:2 if many else 1]]


class NullBackend:
    """Deterministic fake tokens: ``" t<id>"`` with ids drawn from (seed, prompt); no model at all.

    Its "prefix cache" holds the route keys of the last ``held_keys`` requests; a request's prompt
    tokens count as cached in the share of its route keys held when it arrives."""

    def __init__(self, models: list[str] | None = None, slots: int = 8, token_delay_s: float = 0.0,
                 max_prompt_tokens: int = 8192, vocab_size: int = 1000, held_keys: int = 256):
        self.models = list(models or ["null"])
        self.slots = slots
        self.token_delay_s = token_delay_s
        self.max_prompt_tokens = max_prompt_tokens
        self.vocab_size = vocab_size
        self._sessions: dict[str, _NullSession] = {}
        self._held: OrderedDict[bytes, None] = OrderedDict()  # least recently used first
        self._held_limit = held_keys
        self.prompt_tokens = self.cached_prompt_tokens = 0

    @property
    def active(self) -> int:
        return len(self._sessions)

    def add(self, request_id: str, prompt: PromptOrMessages, params: SamplingParams,
            route_keys: Sequence[bytes] = ()) -> None:
        check_room(self.active, self.slots)
        text = prompt if isinstance(prompt, str) else "\n".join(m.get("content") or "" for m in prompt)
        n = len(text.split())  # a word is a "token" here
        check_prompt_length(n, self.max_prompt_tokens)
        check_logit_bias(params.logit_bias, self.vocab_size)
        self._sessions[request_id] = _NullSession(n, params, text)
        self._hold(n, route_keys)

    def _hold(self, prompt_tokens: int, keys: Sequence[bytes]) -> None:
        held = sum(key in self._held for key in keys)
        self.prompt_tokens += prompt_tokens
        self.cached_prompt_tokens += prompt_tokens * held // len(keys) if keys else 0
        for key in keys:
            self._held[key] = None
            self._held.move_to_end(key)
        while len(self._held) > self._held_limit:
            self._held.popitem(last=False)

    def held_route_keys(self, limit: int) -> list[bytes]:
        return list(reversed(self._held))[:max(limit, 0)]

    def record_kv_events(self) -> None:
        pass  # it caches no KV

    def kv_events(self) -> tuple[int, list]:
        return 0, []  # it caches no KV

    def cancel(self, request_id: str) -> None:
        self._sessions.pop(request_id, None)

    def step(self) -> list[Event]:
        if self.token_delay_s:
            time.sleep(self.token_delay_s)  # one "forward pass" for all sessions together
        events: list[Event] = []
        for rid, s in list(self._sessions.items()):
            token_id = s.rng.randrange(self.vocab_size)
            s.token_ids.append(token_id)
            if s.calls:  # the last token allowed carries every piece left
                n = len(s.pieces) if len(s.token_ids) >= s.params.max_tokens else 1
                pieces, s.pieces = tuple(s.pieces[:n]), s.pieces[n:]
                events.append(Token(rid, Delta(len(s.token_ids) - 1, token_id, "", (), pieces)))
                if not s.pieces:
                    del self._sessions[rid]
                    events.append(Finished(rid, self._completion(s)))
                continue
            logprobs = self._logprobs(token_id, s.params.logprobs)
            s.logprobs.extend(logprobs)
            events.append(Token(rid, Delta(len(s.token_ids) - 1, token_id, f" t{token_id}", logprobs)))
            if len(s.token_ids) >= s.params.max_tokens:
                del self._sessions[rid]
                events.append(Finished(rid, self._completion(s)))
        return events

    def idle(self) -> None:
        return None  # no idle work: the worker stops calling (Backend.idle)

    def _logprobs(self, token_id: int, top: int | None) -> tuple[TokenLogprobs, ...]:
        """The true ones: every token is drawn uniformly; the alternatives are the next ids."""
        if top is None:
            return ()
        value = -math.log(self.vocab_size)
        ids = [(token_id + i) % self.vocab_size for i in range(min(top, self.vocab_size))]
        return (TokenLogprobs(Logprob(token_id, f" t{token_id}", value),
                              tuple(Logprob(i, f" t{i}", value) for i in ids)),)

    @staticmethod
    def _completion(s: _NullSession) -> Completion:
        total = time.perf_counter() - s.started
        text = "" if s.calls else "".join(f" t{t}" for t in s.token_ids)
        return Completion(text=text, token_ids=list(s.token_ids),
                          finish_reason="tool_calls" if s.calls else "length",
                          usage=Usage(s.prompt_tokens, len(s.token_ids)), timings={"total_s": total},
                          logprobs=None if s.params.logprobs is None else list(s.logprobs),
                          tool_calls=s.calls)
