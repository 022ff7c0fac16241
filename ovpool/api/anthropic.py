"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) as a dialect over
the chat core (dialect.py): the body becomes a /v1/chat/completions request, the Completion an
Anthropic message, its stream Anthropic's events, every error Anthropic's error JSON.

Text and tool use (anthropic_tools.py): image and document blocks and Anthropic's server tools are
refused. docs/api.md lists what is supported and what is refused.
"""

from __future__ import annotations

from typing import Any

from ovpool import bounds, errors
from ovpool.api import anthropic_tools, sse
from ovpool.api import errors as api_errors
from ovpool.api.dialect import extensions, renamed, reply_id
from ovpool.api.schema import Generate, bad, body_object, parse_chat
from ovpool.completion import Completion, Delta

# HTTP status -> Anthropic's error type; any other status is an api_error.
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error"}
# Else "end_turn", or "stop_sequence" when one of stop_sequences ended the reply (Completion.stop).
_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def parse(body: Any) -> Generate:
    """A /v1/messages body as the chat core's Generate (one choice)."""
    body = body_object(body)
    if body.get("max_tokens") is None:
        raise bad("max_tokens", "is required: the most tokens to generate (Anthropic's API requires it)")
    chat = _chat(body)
    chat.update(max_tokens=body["max_tokens"], stream=body.get("stream"), top_p=body.get("top_p"),
                top_k=body.get("top_k"), stop=_stop_sequences(body.get("stop_sequences")),
                temperature=1.0 if body.get("temperature") is None else
                bounds.number(body["temperature"], "temperature", 0.0, 1.0))
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise bad("metadata", "must be an object such as {\"user_id\": \"...\"}")
    chat["response_format"] = _output_format(body.get("output_config"))
    with renamed({"stop": "stop_sequences", "response_format": "output_config.format"}), \
            anthropic_tools.schemas_named():
        return parse_chat(chat, 1)


def _output_format(config: Any) -> dict[str, Any] | None:
    """``output_config.format`` (Anthropic's structured outputs) as the core's response_format."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise bad("output_config", "must be an object such as {\"format\": {\"type\": \"json_schema\", ...}}")
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or "schema" not in fmt:
        raise bad("output_config.format", "must be {\"type\": \"json_schema\", \"schema\": {...}}")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def parse_count(body: Any) -> Generate:
    """A /v1/messages/count_tokens body: the prompt of ``parse``, one greedy token (its Completion's
    prompt_tokens is the count: the pool has no tokenize-only request)."""
    with anthropic_tools.schemas_named():
        return parse_chat({**_chat(body_object(body)), "max_tokens": 1, "temperature": 0}, 1)


def _chat(body: dict) -> dict[str, Any]:
    system = _system(body.get("system"))
    messages = _messages(body.get("messages"))
    return {"model": body.get("model"), "messages": [*system, *messages], **anthropic_tools.sampling(body),
            **extensions(body)}


def _system(system: Any) -> list[dict[str, str]]:
    if system is None:
        return []
    text = system if isinstance(system, str) else _text_blocks(system, "system")
    return [{"role": "system", "content": bounds.text(text, "system")}] if text else []


def _text_blocks(blocks: Any, where: str) -> str:
    if not isinstance(blocks, list):
        raise bad(where, "must be a string or a list of {\"type\": \"text\", \"text\": ...} blocks")
    return anthropic_tools.text_blocks(blocks, where)


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not 1 <= len(messages) <= bounds.MAX_MESSAGES:
        raise bad("messages", f"must be a list of 1 to {bounds.MAX_MESSAGES} "
                  "{\"role\": \"user\" or \"assistant\", \"content\": ...}")
    out = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise bad(f"messages[{i}].role", "must be \"user\" or \"assistant\" (the system prompt is the "
                      "top-level system field)")
        content, where = message.get("content"), f"messages[{i}].content"
        if isinstance(content, str):
            out.append({"role": role, "content": bounds.text(content, where)})
        elif isinstance(content, list) and len(content) <= bounds.MAX_MESSAGES:
            out.extend(anthropic_tools.message(role, content, where))
        else:
            raise bad(where, f"must be a string or a list of at most {bounds.MAX_MESSAGES} content blocks")
    if messages[-1]["role"] == "assistant":
        raise bad(f"messages[{len(messages) - 1}]", "a last assistant message (a prefill to continue) is "
                  "not supported; end with a user message")
    return out


def _stop_sequences(stops: Any) -> list[str] | None:
    if stops is None:
        return None
    if not isinstance(stops, list) or not all(type(s) is str for s in stops):
        raise bad("stop_sequences", "must be a list of strings")
    return stops


# -- responses --------------------------------------------------------------------------------


def _head(gen: Generate, message_id: str) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": gen.model}


def _stop_reason(c: Completion) -> str:
    if c.finish_reason == "stop" and c.stop is not None:
        return "stop_sequence"
    return _STOP_REASONS.get(c.finish_reason, "end_turn")


def _stopped(c: Completion) -> dict[str, Any]:
    """The message's stop_reason and stop_sequence (which of stop_sequences ended it)."""
    return {"stop_reason": _stop_reason(c), "stop_sequence": c.stop if c.finish_reason == "stop" else None}


def _usage(c: Completion | None) -> dict[str, int]:
    return {"input_tokens": c.usage.prompt_tokens if c else 0,
            "output_tokens": c.usage.completion_tokens if c else 0}


def full(gen: Generate, completions: list[Completion]) -> dict[str, Any]:
    """The non-streamed message: its text block (unless it has only tool calls), a tool_use block
    per call."""
    (c,) = completions
    text = [{"type": "text", "text": c.text}] if c.text or not c.tool_calls else []
    return {**_head(gen, _message_id()), "content": [*text, *map(anthropic_tools.use_block, c.tool_calls)],
            **_stopped(c), "usage": _usage(c)}


def _message_id() -> str:
    return reply_id("msg_")


def _event(kind: str, **fields: Any) -> bytes:
    return sse.event(kind, {"type": kind, **fields})


class MessageWriter:
    """Anthropic's stream (dialect.Writer): message_start; the content blocks, each opened when
    its first piece comes (content_block_start, then ping after the first), its deltas (text_delta,
    or a tool_use block's input_json_delta fragments) and content_block_stop; message_delta (stop
    reason and usage), message_stop. A reply with neither text nor calls has one empty text block,
    as the non-streamed message does. The prompt's token count comes with the Completion, so
    message_start says 0 input tokens and message_delta the real count."""

    def __init__(self, gen: Generate):
        self.gen = gen
        self.completion: Completion | None = None
        self._id = _message_id()
        self._blocks = 0  # content blocks started
        self._open: str | None = None  # the open block's type
        self._calls: dict[int, int] = {}  # a call's index -> its block's

    def opening(self) -> bytes:
        message = {**_head(self.gen, self._id), "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": _usage(None)}
        return _event("message_start", message=message)

    def _start(self, block: dict[str, Any]) -> bytes:
        out = self._stop() + _event("content_block_start", index=self._blocks, content_block=block)
        if not self._blocks:
            out += _event("ping")
        self._blocks += 1
        self._open = block["type"]
        return out

    def _stop(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return _event("content_block_stop", index=self._blocks - 1)

    def delta(self, index: int, delta: Delta) -> bytes:
        out = b""
        if delta.text:
            if self._open != "text":
                out += self._start({"type": "text", "text": ""})
            out += _event("content_block_delta", index=self._blocks - 1,
                          delta={"type": "text_delta", "text": delta.text})
        for piece in delta.tool_calls:
            if piece.id:
                out += self._start({"type": "tool_use", "id": anthropic_tools.use_id(piece.id),
                                    "name": piece.name, "input": {}})
                self._calls[piece.index] = self._blocks - 1
            if piece.arguments and piece.index in self._calls:
                out += _event("content_block_delta", index=self._calls[piece.index],
                              delta={"type": "input_json_delta", "partial_json": piece.arguments})
        return out

    def done(self, index: int, completion: Completion) -> bytes:
        self.completion = completion
        return b""

    def closing(self) -> bytes:
        c = self.completion
        empty = self._start({"type": "text", "text": ""}) if not self._blocks else b""
        return (empty + self._stop()
                + _event("message_delta", usage=_usage(c), delta=_stopped(c))
                + _event("message_stop"))

    def failure(self, exc: errors.OvpoolError) -> bytes:
        return sse.event("error", body(exc))

    def usage(self) -> dict[str, int]:
        u = _usage(self.completion)
        return {"prompt_tokens": u["input_tokens"], "completion_tokens": u["output_tokens"]}


# -- errors (dialect.ErrorShape) ----------------------------------------------------------------


def body(exc: errors.OvpoolError) -> dict[str, Any]:
    return http_body(api_errors.classify(exc)[0], str(exc))


def http_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}}
