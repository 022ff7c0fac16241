"""What differs between the HTTP API's dialects over its one core: OpenAI's chat and completions,
OpenAI's Responses (openai_responses.py) and Anthropic's Messages (anthropic.py).

Each dialect turns its request body into the Generate that /v1/chat/completions serves, and the
core's Completions (or its stream of Deltas) and errors into its own objects; submitting, streaming,
cancelling and flow control are the core's alone (app.py). Renamed fields keep their own names in
errors: ``renamed`` maps the core's ``param`` back to the dialect's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from ovpool import errors
from ovpool.api.schema import Generate
from ovpool.completion import Completion, Delta


def reply_id(prefix: str) -> str:
    """A response's (or message's) id: ``prefix`` and 24 random hex digits. It names, it guards
    nothing: the random module's bits, not secrets' (a getrandom call per response)."""
    return f"{prefix}{random.getrandbits(96):024x}"


class Writer(Protocol):
    """A streamed response's bytes, event by event (sse.Body drives it)."""

    def opening(self) -> bytes: ...  # before the first Delta

    def delta(self, index: int, delta: Delta) -> bytes: ...

    def done(self, index: int, completion: Completion) -> bytes: ...

    def closing(self) -> bytes: ...  # after every choice's Completion

    def failure(self, exc: errors.OvpoolError) -> bytes: ...  # instead of the rest

    def usage(self) -> dict[str, int]: ...  # prompt_tokens, completion_tokens: the metrics' count


class ErrorShape(Protocol):
    """A dialect's error JSON: of an ovpool error, and of the HTTP layer's own (413, 404)."""

    def body(self, exc: errors.OvpoolError) -> dict[str, Any]: ...

    def http_body(self, status: int, message: str) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Dialect:
    endpoint: str  # the metrics' endpoint label
    parse: Callable[[Any], Generate]
    full: Callable[[Generate, list[Completion]], dict[str, Any]]
    writer: Callable[[Generate], Writer]
    errors: ErrorShape


@contextmanager
def renamed(names: dict[str, str]) -> Iterator[None]:
    """An InvalidRequestError of the core naming a field this dialect calls otherwise names it as
    the dialect does (``{"stop": "stop_sequences"}``)."""
    try:
        yield
    except errors.InvalidRequestError as exc:
        name = names.get(exc.param or "")
        if name is None:
            raise
        # The core's message names its own field first ("max_tokens: ...", "sampling: stop ...").
        why = str(exc).removeprefix(f"{exc.param}: ").removeprefix(f"sampling: {exc.param} ")
        raise errors.InvalidRequestError(f"{name}: {why}", param=name) from None


def extensions(body: dict) -> dict[str, Any]:
    """ovpool's own fields, as /v1/chat/completions takes them: ``seed`` (the same tokens again),
    ``timeout`` (seconds before a 504) and ``keep_alive`` (Ollama's: how long the model stays loaded)."""
    return {name: body[name] for name in ("seed", "timeout", "keep_alive") if name in body}
