"""OpenAI response objects (completions, chat completions, their stream chunks, usage) as plain
dicts, from ovpool Completions and Deltas. Pure functions."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ovpool.api.schema import Generate
from ovpool.completion import Completion


@dataclass
class Reply:
    """What every object of one response shares: its id, creation time and model."""

    gen: Generate
    id: str = ""
    created: int = 0
    # Streaming: choices that have sent their first chunk, and finished completions by choice index.
    started: set[int] = field(default_factory=set)
    finished: dict[int, Completion] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.gen.chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())

    @property
    def object(self) -> str:
        return "chat.completion" if self.gen.chat else "text_completion"

    def head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.gen.model}


def usage(gen: Generate, completions: Iterable[tuple[int, Completion]]) -> dict[str, int]:
    """Tokens of the whole response: each prompt once (n choices share it), every completion."""
    prompt = completion = 0
    for index, c in completions:
        if index % gen.n == 0:
            prompt += c.usage.prompt_tokens
        completion += c.usage.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def full(reply: Reply, completions: list[Completion]) -> dict[str, Any]:
    """The non-streamed response for ``completions`` (in choice order)."""
    gen = reply.gen
    pairs = list(zip(gen.choices, completions, strict=True))
    return {**reply.head(reply.object), "choices": [_choice(gen, ch.index, ch.prompt, c) for ch, c in pairs],
            "usage": usage(gen, ((ch.index, c) for ch, c in pairs))}


def _choice(gen: Generate, index: int, prompt: Any, c: Completion) -> dict[str, Any]:
    if gen.chat:
        return {"index": index, "message": {"role": "assistant", "content": c.text}, "logprobs": None,
                "finish_reason": c.finish_reason}
    text = prompt + c.text if gen.echo else c.text
    return {"index": index, "text": text, "logprobs": None, "finish_reason": c.finish_reason}


def chunk(reply: Reply, index: int, text: str) -> dict[str, Any]:
    """A stream chunk carrying ``text`` for choice ``index`` (the first one of a chat choice also
    carries its role; the first of an echoing completion, its prompt)."""
    gen = reply.gen
    first = index not in reply.started
    reply.started.add(index)
    if gen.chat:
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        body = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
    else:
        if first and gen.echo:
            text = gen.choices[index].prompt + text
        body = {"index": index, "text": text, "logprobs": None, "finish_reason": None}
    return _chunk(reply, body)


def last_chunk(reply: Reply, index: int, c: Completion) -> dict[str, Any]:
    """A choice's final chunk: no text, its finish reason."""
    reply.finished[index] = c
    if reply.gen.chat:
        delta = {} if index in reply.started else {"role": "assistant", "content": ""}
        body = {"index": index, "delta": delta, "logprobs": None, "finish_reason": c.finish_reason}
    else:
        body = {"index": index, "text": "", "logprobs": None, "finish_reason": c.finish_reason}
    reply.started.add(index)
    return _chunk(reply, body)


def usage_chunk(reply: Reply) -> dict[str, Any]:
    """``stream_options.include_usage``: the last chunk, no choices, the whole response's usage."""
    kind = "chat.completion.chunk" if reply.gen.chat else "text_completion"
    return {**reply.head(kind), "choices": [], "usage": usage(reply.gen, reply.finished.items())}


def _chunk(reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
    kind = "chat.completion.chunk" if reply.gen.chat else "text_completion"
    out = {**reply.head(kind), "choices": [body]}
    if reply.gen.include_usage:
        out["usage"] = None  # OpenAI: null on every chunk but the last
    return out
