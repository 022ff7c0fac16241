"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) as a dialect over
the chat core (dialect.py): the body becomes a /v1/chat/completions request, the Completion an
Anthropic message, its stream Anthropic's events, every error Anthropic's error JSON.

Text only: image and document blocks are refused, as are tools until the worker constrains tool
calls (issue 27). docs/api.md lists what is supported and what is refused.
"""

from __future__ import annotations

import secrets
from typing import Any

from ovpool import bounds, errors
from ovpool.api import errors as api_errors
from ovpool.api import sse
from ovpool.api.dialect import extensions, renamed
from ovpool.api.schema import Generate, bad, body_object, no_tools, parse_chat
from ovpool.completion import Completion, Delta

# HTTP status -> Anthropic's error type; any other status is an api_error.
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error"}
_STOP_REASONS = {"length": "max_tokens"}  # else "end_turn" (see docs/api.md for stop_sequence)
_NO_TOOL_CHOICES = ("auto", "none")


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
    with renamed({"stop": "stop_sequences", "response_format": "output_config.format"}):
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
    return parse_chat({**_chat(body_object(body)), "max_tokens": 1, "temperature": 0}, 1)


def _chat(body: dict) -> dict[str, Any]:
    no_tools(body, lambda choice: isinstance(choice, dict) and choice.get("type") in _NO_TOOL_CHOICES)
    system = _system(body.get("system"))
    messages = _messages(body.get("messages"))
    return {"model": body.get("model"), "messages": [*system, *messages], **extensions(body)}


def _system(system: Any) -> list[dict[str, str]]:
    if system is None:
        return []
    text = system if isinstance(system, str) else _blocks(system, "system")
    return [{"role": "system", "content": bounds.text(text, "system")}] if text else []


def _messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not 1 <= len(messages) <= bounds.MAX_MESSAGES:
        raise bad("messages", f"must be a list of 1 to {bounds.MAX_MESSAGES} "
                  "{\"role\": \"user\" or \"assistant\", \"content\": ...}")
    out = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise bad(f"messages[{i}].role", "must be \"user\" or \"assistant\" (the system prompt is the "
                      "top-level system field)")
        content = message.get("content")
        text = content if isinstance(content, str) else _blocks(content, f"messages[{i}].content")
        out.append({"role": role, "content": bounds.text(text, f"messages[{i}].content")})
    if out[-1]["role"] == "assistant":
        raise bad(f"messages[{len(out) - 1}]", "a last assistant message (a prefill to continue) is not "
                  "supported; end with a user message")
    return out


def _blocks(blocks: Any, where: str) -> str:
    """Text blocks' text, joined; any other block is refused, naming it."""
    if not isinstance(blocks, list) or len(blocks) > bounds.MAX_MESSAGES:
        raise bad(where, f"must be a string or a list of at most {bounds.MAX_MESSAGES} "
                  "{\"type\": \"text\", \"text\": ...} blocks")
    parts = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(bounds.text(block.get("text"), f"{where}[{j}].text"))
        elif kind in ("image", "document"):
            raise bad(f"{where}[{j}]", f"{kind} blocks are not supported: this server reads text only")
        elif kind in ("tool_use", "tool_result"):
            raise bad(f"{where}[{j}]", f"{kind} blocks: tool use is not supported yet")
        else:
            raise bad(f"{where}[{j}].type", f"must be \"text\", got {bounds.describe(kind)}")
    return "".join(parts)


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
    return _STOP_REASONS.get(c.finish_reason, "end_turn")


def _usage(c: Completion | None) -> dict[str, int]:
    return {"input_tokens": c.usage.prompt_tokens if c else 0,
            "output_tokens": c.usage.completion_tokens if c else 0}


def full(gen: Generate, completions: list[Completion]) -> dict[str, Any]:
    """The non-streamed message."""
    (c,) = completions
    return {**_head(gen, _message_id()), "content": [{"type": "text", "text": c.text}],
            "stop_reason": _stop_reason(c), "stop_sequence": None, "usage": _usage(c)}


def _message_id() -> str:
    return "msg_" + secrets.token_hex(12)


class MessageWriter:
    """Anthropic's stream (dialect.Writer): message_start, one text block (content_block_start,
    ping, a text_delta per Delta, content_block_stop), message_delta (stop reason and usage),
    message_stop. The prompt's token count comes with the Completion, so message_start says 0
    input tokens and message_delta the real count."""

    def __init__(self, gen: Generate):
        self.gen = gen
        self.completion: Completion | None = None
        self._id = _message_id()

    def opening(self) -> bytes:
        message = {**_head(self.gen, self._id), "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": _usage(None)}
        return (sse.event("message_start", {"type": "message_start", "message": message})
                + sse.event("content_block_start", {"type": "content_block_start", "index": 0,
                                                    "content_block": {"type": "text", "text": ""}})
                + sse.event("ping", {"type": "ping"}))

    def delta(self, index: int, delta: Delta) -> bytes:
        return sse.event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                 "delta": {"type": "text_delta", "text": delta.text}})

    def done(self, index: int, completion: Completion) -> bytes:
        self.completion = completion
        return b""

    def closing(self) -> bytes:
        c = self.completion
        return (sse.event("content_block_stop", {"type": "content_block_stop", "index": 0})
                + sse.event("message_delta", {"type": "message_delta", "usage": _usage(c), "delta": {
                    "stop_reason": _stop_reason(c), "stop_sequence": None}})
                + sse.event("message_stop", {"type": "message_stop"}))

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
