"""OpenAI's Responses API (``POST /v1/responses``), stateless, as a dialect over the chat core
(dialect.py): ``instructions`` and ``input`` become chat messages, ``text.format`` the
response_format, the Completion a response object, its stream the Responses API's typed events.
Function tools and their calls are responses_tools.py's. Errors keep OpenAI's JSON. Nothing is
stored: ``previous_response_id`` is refused and ``store`` ignored.
"""

from __future__ import annotations

import time
from typing import Any

from ovpool import bounds, errors
from ovpool.api import errors as api_errors
from ovpool.api import responses_tools, sse
from ovpool.api.dialect import extensions, renamed, reply_id
from ovpool.api.schema import Generate, bad, body_object, parse_chat
from ovpool.completion import Completion, Delta
from ovpool.tools import ToolCall, ToolCallDelta

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
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
    instructions = body.get("instructions")
    system = [] if instructions is None else [{"role": "system",
                                                "content": bounds.text(instructions, "instructions")}]
    chat = {"model": body.get("model"), "messages": [*system, *_input(body.get("input"))],
            "max_tokens": body.get("max_output_tokens"), "temperature": body.get("temperature"),
            "top_p": body.get("top_p"), "stream": body.get("stream"),
            "response_format": _format(body.get("text")), **responses_tools.sampling(body),
            **extensions(body)}
    with renamed(_RENAMES):
        return parse_chat(chat, max_tokens)


def _input(items: Any) -> list[dict[str, Any]]:
    """``input`` as canonical messages: message items, and function_call (a call of the assistant
    message before it) and function_call_output items (responses_tools)."""
    if isinstance(items, str):
        return [{"role": "user", "content": bounds.text(items, "input")}]
    if not isinstance(items, list) or not 1 <= len(items) <= bounds.MAX_MESSAGES:
        raise bad("input", f"must be a string or a list of 1 to {bounds.MAX_MESSAGES} items "
                  "{\"role\": ..., \"content\": ...}")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "function_call":
            responses_tools.call_item(item, f"input[{i}]", out)
        elif kind == "function_call_output":
            out.append(responses_tools.output_item(item, f"input[{i}]"))
        elif kind == "message":
            out.append(_message(item, f"input[{i}]"))
        else:
            raise bad(f"input[{i}].type", "must be \"message\", \"function_call\" or \"function_call_output\""
                      f", got {bounds.describe(kind)}")
    return out


def _message(item: dict, where: str) -> dict[str, str]:
    role = _ROLES.get(item.get("role")) if isinstance(item.get("role"), str) else None
    if role is None:
        raise bad(f"{where}.role", f"must be one of {sorted(_ROLES)}")
    content = item.get("content")
    if isinstance(content, list):
        if len(content) > bounds.MAX_MESSAGES:
            raise bad(f"{where}.content", f"{len(content):,} parts; at most {bounds.MAX_MESSAGES}")
        content = "".join(responses_tools.text_part(part, f"{where}.content[{j}]")
                          for j, part in enumerate(content))
    if not isinstance(content, str):
        raise bad(f"{where}.content", "must be a string or a list of {\"type\": \"input_text\", "
                  "\"text\": ...} parts")
    return {"role": role, "content": bounds.text(content, f"{where}.content")}


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
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": c.usage.cached_prompt_tokens},
            "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + out}


def _part_of(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _item(item_id: str, status: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": parts}


class _Response:
    """What every object of one response shares."""

    def __init__(self, gen: Generate):
        self.gen = gen
        self.id, self.item_id = reply_id("resp_"), reply_id("msg_")
        self.created_at = int(time.time())

    def object(self, c: Completion | None, output: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The response, in progress (``c`` None) or finished as ``c`` (its items ``output``, else
        the message of its text, unless it has only calls, then a function_call item per call)."""
        status = "in_progress" if c is None else "incomplete" if c.finish_reason == "length" else "completed"
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        if output is None:
            output = [] if c is None else self._output(c)
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "model": self.gen.model, "output": output, "error": None, "incomplete_details": incomplete,
                "usage": None if c is None else _usage(c), **responses_tools.echoed(self.gen),
                "store": False, "previous_response_id": None}

    def _output(self, c: Completion) -> list[dict[str, Any]]:
        text = [_item(self.item_id, "completed", [_part_of(c.text)])] if c.text or not c.tool_calls else []
        return [*text, *map(responses_tools.call_output, c.tool_calls)]


def full(gen: Generate, completions: list[Completion]) -> dict[str, Any]:
    """The non-streamed response."""
    (c,) = completions
    return _Response(gen).object(c)


class ResponseWriter:
    """The Responses API's stream (dialect.Writer): response.created and .in_progress; each output
    item added when its first piece comes (a message item with its output_text part, then
    output_text deltas; a function_call item, then its function_call_arguments deltas), and done
    (the text, part and item; the arguments and item) when the next begins or the reply ends;
    response.completed (response.incomplete past max_output_tokens), each event with its
    sequence_number. A reply with neither text nor calls has one empty message, as the
    non-streamed response does."""

    def __init__(self, gen: Generate):
        self.response = _Response(gen)
        self.completion: Completion | None = None
        self._seq = 0
        self._items: list[dict[str, Any]] = []  # the output items so far, each as it is now
        self._open: int | None = None  # the output index of the item still growing
        self._calls: dict[int, int] = {}  # a call's index -> its item's output index

    def _event(self, kind: str, **fields: Any) -> bytes:
        self._seq += 1
        return sse.event(kind, {"type": kind, "sequence_number": self._seq - 1, **fields})

    def _at(self, index: int) -> dict[str, Any]:
        return {"item_id": self._items[index]["id"], "output_index": index}

    def opening(self) -> bytes:
        head = self.response.object(None)
        return (self._event("response.created", response=head)
                + self._event("response.in_progress", response=head))

    def _add(self, item: dict[str, Any]) -> bytes:
        out = self._close()
        self._items.append(item)
        self._open = len(self._items) - 1
        return out + self._event("response.output_item.added", output_index=self._open, item=item)

    def _text(self, text: str) -> bytes:
        out = b""
        if self._open is None or self._items[self._open]["type"] != "message":
            item_id = self.response.item_id if not self._items else reply_id("msg_")
            out = self._add(_item(item_id, "in_progress", []))
            self._items[self._open]["content"].append(_part_of(""))
            out += self._event("response.content_part.added", **self._at(self._open), content_index=0,
                               part=_part_of(""))
        self._items[self._open]["content"][0]["text"] += text
        return out + self._event("response.output_text.delta", **self._at(self._open), content_index=0,
                                 delta=text, logprobs=[])

    def _piece(self, piece: ToolCallDelta) -> bytes:
        out = b""
        if piece.id:
            call = ToolCall(piece.id, piece.name, "")
            out = self._add(responses_tools.call_output(call, "in_progress"))
            self._calls[piece.index] = self._open
        index = self._calls.get(piece.index)
        if not piece.arguments or index is None:
            return out
        self._items[index]["arguments"] += piece.arguments
        return out + self._event("response.function_call_arguments.delta", **self._at(index),
                                 delta=piece.arguments)

    def _close(self) -> bytes:
        """The open item's done events."""
        index, self._open = self._open, None
        if index is None:
            return b""
        item = self._items[index]
        item["status"] = "completed"
        if item["type"] == "message":
            part = item["content"][0]
            out = (self._event("response.output_text.done", **self._at(index), content_index=0,
                               text=part["text"], logprobs=[])
                   + self._event("response.content_part.done", **self._at(index), content_index=0, part=part))
        else:
            out = self._event("response.function_call_arguments.done", **self._at(index),
                              arguments=item["arguments"])
        return out + self._event("response.output_item.done", output_index=index, item=item)

    def delta(self, index: int, delta: Delta) -> bytes:
        out = self._text(delta.text) if delta.text else b""
        return out + b"".join(self._piece(piece) for piece in delta.tool_calls)

    def done(self, index: int, completion: Completion) -> bytes:
        self.completion = completion
        return b""

    def closing(self) -> bytes:
        c = self.completion
        out = self._text("") if not self._items else b""
        for call, index in self._calls.items():
            if call >= len(c.tool_calls):  # cut at max_output_tokens before its end
                self._items[index]["status"] = "incomplete"
        out += self._close()
        whole = self.response.object(c, self._items)
        kind = "response.incomplete" if whole["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, response=whole)

    def failure(self, exc: errors.OvpoolError) -> bytes:
        error = api_errors.body(exc)["error"]
        return self._event("error", code=error["code"], message=error["message"], param=error["param"])

    def usage(self) -> dict[str, int]:
        c = self.completion
        return {"prompt_tokens": c.usage.prompt_tokens if c else 0,
                "completion_tokens": c.usage.completion_tokens if c else 0}
