"""OpenAI's Responses API (``POST /v1/responses``), stateless, as a dialect over the chat core
(dialect.py): ``instructions`` and ``input`` become chat messages, ``text.format`` the
response_format, the Completion a response object, its stream the Responses API's typed events.
Errors keep OpenAI's JSON. Nothing is stored: ``previous_response_id`` is refused and ``store``
ignored; function tools are refused until the worker constrains tool calls (issue 27).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from ovpool import bounds, errors
from ovpool.api import errors as api_errors
from ovpool.api import sse
from ovpool.api.dialect import extensions, renamed
from ovpool.api.schema import Generate, bad, body_object, no_tools, parse_chat
from ovpool.completion import Completion, Delta

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text")
_RENAMES = {"max_tokens": "max_output_tokens", "response_format": "text.format", "messages": "input"}


def parse(body: Any, max_tokens: int) -> Generate:
    """A /v1/responses body as the chat core's Generate; ``max_tokens``: the default output."""
    body = body_object(body)
    for field in ("previous_response_id", "conversation"):
        if body.get(field) is not None:
            raise bad(field, "this server is stateless and stores no responses; send the whole "
                      "conversation in input")
    if body.get("store") is not None and not isinstance(body["store"], bool):
        raise bad("store", f"must be true or false, got {bounds.describe(body['store'])}")
    no_tools(body)
    instructions = body.get("instructions")
    system = [] if instructions is None else [{"role": "system",
                                                "content": bounds.text(instructions, "instructions")}]
    chat = {"model": body.get("model"), "messages": [*system, *_input(body.get("input"))],
            "max_tokens": body.get("max_output_tokens"), "temperature": body.get("temperature"),
            "top_p": body.get("top_p"), "stream": body.get("stream"),
            "response_format": _format(body.get("text")), **extensions(body)}
    with renamed(_RENAMES):
        return parse_chat(chat, max_tokens)


def _input(items: Any) -> list[dict[str, str]]:
    if isinstance(items, str):
        return [{"role": "user", "content": bounds.text(items, "input")}]
    if not isinstance(items, list) or not 1 <= len(items) <= bounds.MAX_MESSAGES:
        raise bad("input", f"must be a string or a list of 1 to {bounds.MAX_MESSAGES} message items "
                  "{\"role\": ..., \"content\": ...}")
    return [_message(item, f"input[{i}]") for i, item in enumerate(items)]


def _message(item: Any, where: str) -> dict[str, str]:
    if not isinstance(item, dict) or item.get("type", "message") != "message":
        kind = item.get("type") if isinstance(item, dict) else item
        raise bad(f"{where}.type", f"only message items are supported (function calls are not yet), "
                  f"got {bounds.describe(kind)}")
    role = _ROLES.get(item.get("role")) if isinstance(item.get("role"), str) else None
    if role is None:
        raise bad(f"{where}.role", f"must be one of {sorted(_ROLES)}")
    content = item.get("content")
    if isinstance(content, list) and len(content) <= bounds.MAX_MESSAGES:
        content = "".join(_part(part, f"{where}.content[{j}]") for j, part in enumerate(content))
    if not isinstance(content, str):
        raise bad(f"{where}.content", "must be a string or a list of {\"type\": \"input_text\", "
                  "\"text\": ...} parts")
    return {"role": role, "content": bounds.text(content, f"{where}.content")}


def _part(part: Any, where: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in _TEXT_PARTS:
        raise bad(where, f"only text parts ({', '.join(_TEXT_PARTS)}) are supported, got "
                  f"{bounds.describe(kind)}")
    return bounds.text(part.get("text"), f"{where}.text")


def _format(text: Any) -> dict[str, Any] | None:
    """``text.format`` as the core's response_format (checked there, named text.format)."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        if not isinstance(text, dict):
            raise bad("text", "must be an object such as {\"format\": {\"type\": \"json_schema\", ...}}")
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad("text.format", "must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                  "{\"type\": \"json_schema\", \"name\": ..., \"schema\": {...}}")
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


# -- responses --------------------------------------------------------------------------------


def _usage(c: Completion) -> dict[str, Any]:
    prompt, out = c.usage.prompt_tokens, c.usage.completion_tokens
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + out}


def _part_of(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _item(item_id: str, status: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": parts}


class _Response:
    """What every object of one response shares."""

    def __init__(self, gen: Generate):
        self.gen = gen
        self.id, self.item_id = "resp_" + secrets.token_hex(12), "msg_" + secrets.token_hex(12)
        self.created_at = int(time.time())

    def object(self, c: Completion | None) -> dict[str, Any]:
        """The response, in progress (``c`` None) or finished as ``c``."""
        status = "in_progress" if c is None else "incomplete" if c.finish_reason == "length" else "completed"
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        output = [] if c is None else [_item(self.item_id, "completed", [_part_of(c.text)])]
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "model": self.gen.model, "output": output, "error": None, "incomplete_details": incomplete,
                "usage": None if c is None else _usage(c), "tools": [], "tool_choice": "auto",
                "parallel_tool_calls": False, "store": False, "previous_response_id": None}


def full(gen: Generate, completions: list[Completion]) -> dict[str, Any]:
    """The non-streamed response."""
    (c,) = completions
    return _Response(gen).object(c)


class ResponseWriter:
    """The Responses API's stream (dialect.Writer): response.created and .in_progress, the message
    item and its output_text part added, a delta per Delta, then the text, part and item done and
    response.completed (response.incomplete past max_output_tokens), each with its sequence_number."""

    def __init__(self, gen: Generate):
        self.response = _Response(gen)
        self.completion: Completion | None = None
        self._seq = 0

    def _event(self, kind: str, **fields: Any) -> bytes:
        self._seq += 1
        return sse.event(kind, {"type": kind, "sequence_number": self._seq - 1, **fields})

    def _at(self) -> dict[str, Any]:
        return {"item_id": self.response.item_id, "output_index": 0, "content_index": 0}

    def opening(self) -> bytes:
        head = self.response.object(None)
        return (self._event("response.created", response=head)
                + self._event("response.in_progress", response=head)
                + self._event("response.output_item.added", output_index=0,
                              item=_item(self.response.item_id, "in_progress", []))
                + self._event("response.content_part.added", **self._at(), part=_part_of("")))

    def delta(self, index: int, delta: Delta) -> bytes:
        return self._event("response.output_text.delta", **self._at(), delta=delta.text, logprobs=[])

    def done(self, index: int, completion: Completion) -> bytes:
        self.completion = completion
        return b""

    def closing(self) -> bytes:
        c = self.completion
        whole = self.response.object(c)
        kind = "response.incomplete" if whole["status"] == "incomplete" else "response.completed"
        return (self._event("response.output_text.done", **self._at(), text=c.text, logprobs=[])
                + self._event("response.content_part.done", **self._at(), part=_part_of(c.text))
                + self._event("response.output_item.done", output_index=0, item=whole["output"][0])
                + self._event(kind, response=whole))

    def failure(self, exc: errors.OvpoolError) -> bytes:
        error = api_errors.body(exc)["error"]
        return self._event("error", code=error["code"], message=error["message"], param=error["param"])

    def usage(self) -> dict[str, int]:
        c = self.completion
        return {"prompt_tokens": c.usage.prompt_tokens if c else 0,
                "completion_tokens": c.usage.completion_tokens if c else 0}
