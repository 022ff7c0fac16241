"""The HTTP API's app in this process in front of a scripted pool that calls tools: the app's
AsyncClient replaced by ``ScriptedClient``, which checks every request's SamplingParams as the
real client does and answers from ``reply``, so the dialects' tool translations meet the official
SDKs without a worker (each request costs a millisecond). The real worker's calls are checked
against SmolLM2 in test_api_tools_served.py.

``reply``: with tools to call, a call of the named tool, or of the first (of every tool when
tool_choice is "required" and parallel calls are allowed), its arguments ARGUMENTS[name] (or
{}); under "auto" the text PREAMBLE comes first, unless the last message is a tool's result.
Otherwise the text "result: " and the last tool message's content (or "none"). Streams split the
text in words and each call's arguments in 4-character fragments, two fragments per Delta.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

from starlette.testclient import TestClient

from ovpool.api import core as api_core
from ovpool.api.app import Config, create_app
from ovpool.api.keys import ApiKeys
from ovpool.client_link import LinkState
from ovpool.completion import Completion, Delta, Usage
from ovpool.sampling_params import SamplingParams
from ovpool.settings import Settings
from ovpool.tools import ToolCall, ToolCallDelta

ARGUMENTS = {"get_weather": {"city": "Paris", "unit": "celsius"}, "add": {"a": 2, "b": 3}}
PREAMBLE = "Let me check."


def calls_of(params: SamplingParams) -> list[ToolCall]:
    if not params.calls_tools:
        return []
    names = [t["name"] for t in params.tools]
    if isinstance(params.tool_choice, dict):
        names = [params.tool_choice["name"]]
    elif params.tool_choice != "required" or not params.parallel_tool_calls:
        names = names[:1]
    return [ToolCall(f"call_{i:024d}", name, json.dumps(ARGUMENTS.get(name, {})))
            for i, name in enumerate(names)]


def reply(prompt: Any, params: SamplingParams) -> tuple[str, list[ToolCall]]:
    results = [m["content"] for m in prompt if m.get("role") == "tool"] if isinstance(prompt, list) else []
    answered = isinstance(prompt, list) and prompt[-1]["role"] == "tool" and params.tool_choice == "auto"
    calls = [] if answered else calls_of(params)
    if calls:
        return (PREAMBLE if params.tool_choice == "auto" else ""), calls
    return "result: " + (results[-1] if results else "none"), []


def completion(prompt: Any, params: SamplingParams) -> Completion:
    text, calls = reply(prompt, params)
    tokens = len(text.split()) + sum(len(c.arguments) // 4 + 1 for c in calls)
    return Completion(text, list(range(tokens)), "tool_calls" if calls else "stop", Usage(3, tokens),
                      tool_calls=calls)


def deltas(prompt: Any, params: SamplingParams) -> list[Delta]:
    text, calls = reply(prompt, params)
    words = text.split(" ")
    out = [Delta(i, i, w if i == 0 else " " + w) for i, w in enumerate(words) if text]
    for c in calls:
        out.append(Delta(len(out), 0, "", tool_calls=(ToolCallDelta(calls.index(c), c.id, c.name, ""),)))
        pieces = [c.arguments[j:j + 4] for j in range(0, len(c.arguments), 4)]
        for j in range(0, len(pieces), 2):
            out.append(Delta(len(out), 0, "", tool_calls=tuple(ToolCallDelta(calls.index(c), "", "", p)
                                                               for p in pieces[j:j + 2])))
    return out


class _Stream:
    def __init__(self, items: list[Delta], done: Completion):
        self._items, self.completion = iter(items), done

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> Delta:
        await asyncio.sleep(0)
        try:
            return next(self._items)
        except StopIteration:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        pass


class ScriptedClient:
    """What the app uses of AsyncClient, answering from the script above; ``requests`` records
    each request's (prompt, SamplingParams)."""

    requests: list[tuple[Any, SamplingParams]] = []

    def __init__(self, broker: str, settings: Any = None):
        self.healthy = True

    async def __aenter__(self) -> ScriptedClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    def _params(self, prompt: Any, sampling: dict, params: SamplingParams | None) -> SamplingParams:
        params = params if params is not None else SamplingParams(**sampling)
        self.requests.append((prompt, params))
        return params

    def submit(self, prompt: Any, *, model: str | None = None, timeout: float | None = None,
               keep_alive: float | None = None, params: SamplingParams | None = None,
               **sampling: Any) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        future.set_result(completion(prompt, self._params(prompt, sampling, params)))
        return future

    def stream(self, prompt: Any, *, model: str | None = None, timeout: float | None = None,
               keep_alive: float | None = None, params: SamplingParams | None = None,
               **sampling: Any) -> _Stream:
        params = self._params(prompt, sampling, params)
        return _Stream(deltas(prompt, params), completion(prompt, params))

    async def cancel(self, request: Any) -> None:
        pass

    async def status(self, timeout: float = 10.0) -> dict:
        return {"workers": [{"models": ["m"], "load": {}}]}

    def link_state(self) -> LinkState:
        return LinkState(True, True, 0.0, 0, "")


@contextlib.contextmanager
def scripted_app() -> Iterator[TestClient]:
    """The app with ScriptedClient as its pool client."""
    real = api_core.AsyncClient
    api_core.AsyncClient = ScriptedClient
    try:
        settings = Settings.resolve({"broker": "tcp://127.0.0.1:1"})
        with TestClient(create_app(Config("tcp://127.0.0.1:1", settings, ApiKeys(()), 64))) as http:
            yield http
    finally:
        api_core.AsyncClient = real
