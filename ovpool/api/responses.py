"""OpenAI response objects (completions, chat completions, their stream chunks, usage) as plain
dicts, from ovpool Completions and Deltas. Pure functions."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ovpool import errors
from ovpool.api import chat_tools, sse
from ovpool.api.dialect import reply_id
from ovpool.api.schema import Generate
from ovpool.completion import Completion, Delta, Logprob, TokenLogprobs
from ovpool.tools import ToolCallDelta


@dataclass
class Reply:
    """What every object of one response shares: its id, creation time and model."""

    gen: Generate
    id: str = ""
    created: int = 0
    # Streaming: choices that have sent their first chunk, and finished completions by choice index.
    started: set[int] = field(default_factory=set)
    finished: dict[int, Completion] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)  # completions' text_offset, per choice

    def __post_init__(self) -> None:
        self.id = reply_id("chatcmpl-" if self.gen.chat else "cmpl-")
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
    logprobs = None if gen.logprobs is None else logprobs_object(gen, c.logprobs or (), 0)
    if gen.chat:
        return _noted({"index": index, "message": chat_tools.message(c),
                       "logprobs": logprobs, "finish_reason": c.finish_reason}, c)
    text = prompt + c.text if gen.echo else c.text
    return _noted({"index": index, "text": text, "logprobs": logprobs, "finish_reason": c.finish_reason}, c)


def _noted(choice: dict[str, Any], c: Completion) -> dict[str, Any]:
    """A choice with ovpool's ``note`` beside its finish_reason when there is one (Completion.note:
    e.g. the context filled before max_tokens); OpenAI's SDKs keep unknown fields (model_extra)."""
    if c.note:
        choice["note"] = c.note
    return choice


def chunk(reply: Reply, index: int, text: str, tokens: Sequence[TokenLogprobs] = (),
          calls: tuple[ToolCallDelta, ...] = ()) -> dict[str, Any]:
    """A stream chunk carrying ``text`` (and the pieces of tool ``calls``) for choice ``index`` and
    its tokens' log-probabilities if asked for (the first chunk of a chat choice also carries its
    role; the first of an echoing completion, its prompt)."""
    gen = reply.gen
    first = index not in reply.started
    reply.started.add(index)
    logprobs = None
    if gen.logprobs is not None:
        offset = reply.offsets.get(index, 0)
        logprobs = logprobs_object(gen, tokens, offset)
        reply.offsets[index] = offset + sum(len(t.chosen.text) for t in tokens)
    if gen.chat:
        body = {"index": index, "delta": chat_tools.delta(first, text, calls), "logprobs": logprobs,
                "finish_reason": None}
    else:
        if first and gen.echo:
            text = gen.choices[index].prompt + text
        body = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": None}
    return _chunk(reply, body)


def logprobs_object(gen: Generate, tokens: Sequence[TokenLogprobs], offset: int) -> dict[str, Any]:
    """OpenAI's ``logprobs`` of a choice or a chunk: chat's ``content`` list, or the completions
    API's parallel lists (``top_logprobs`` maps text to logprob and, as OpenAI's, always holds the
    chosen token: up to logprobs + 1 entries)."""
    if gen.chat:
        return {"content": [_chat_entry(t.chosen, t.top) for t in tokens], "refusal": None}
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.chosen.text)
    return {"tokens": [t.chosen.text for t in tokens],
            "token_logprobs": [t.chosen.logprob for t in tokens],
            "top_logprobs": [{**{x.text: x.logprob for x in t.top}, t.chosen.text: t.chosen.logprob}
                             for t in tokens],
            "text_offset": offsets}


def _chat_entry(lp: Logprob, top: Sequence[Logprob] | None = None) -> dict[str, Any]:
    entry = {"token": lp.text, "logprob": lp.logprob, "bytes": list(lp.text.encode())}
    if top is not None:
        entry["top_logprobs"] = [_chat_entry(t) for t in top]
    return entry


def last_chunk(reply: Reply, index: int, c: Completion) -> dict[str, Any]:
    """A choice's final chunk: no text, its finish reason."""
    reply.finished[index] = c
    if reply.gen.chat:
        delta = {} if index in reply.started else {"role": "assistant", "content": ""}
        body = {"index": index, "delta": delta, "logprobs": None, "finish_reason": c.finish_reason}
    else:
        body = {"index": index, "text": "", "logprobs": None, "finish_reason": c.finish_reason}
    reply.started.add(index)
    return _chunk(reply, _noted(body, c))


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


class ChunkWriter:
    """OpenAI's stream (dialect.Writer): a chunk per Delta, each choice's last chunk, the usage
    chunk if asked for, ``data: [DONE]``; a failure is an error event before [DONE]."""

    def __init__(self, gen: Generate):
        self.reply = Reply(gen)

    def opening(self) -> bytes:
        return b""

    def delta(self, index: int, delta: Delta) -> bytes:
        return sse.data(chunk(self.reply, index, delta.text, delta.logprobs, delta.tool_calls))

    def done(self, index: int, completion: Completion) -> bytes:
        return sse.data(last_chunk(self.reply, index, completion))

    def closing(self) -> bytes:
        return (sse.data(usage_chunk(self.reply)) if self.reply.gen.include_usage else b"") + sse.DONE

    def failure(self, exc: errors.OvpoolError) -> bytes:
        return sse.error(exc) + sse.DONE

    def usage(self) -> dict[str, int]:
        return usage(self.reply.gen, self.reply.finished.items())


def whole(gen: Generate, completions: list[Completion]) -> dict[str, Any]:
    """The non-streamed response, as dialect.Dialect's ``full``."""
    return full(Reply(gen), completions)
