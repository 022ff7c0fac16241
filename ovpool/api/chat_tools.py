"""OpenAI chat's tool calling as the core's (ovpool.tools, docs/tools.md): the body's ``tools``,
``tool_choice`` and ``parallel_tool_calls`` become SamplingParams fields (checked there, once),
the history's assistant ``tool_calls`` and ``tool`` messages the canonical messages, and a
Completion's or Delta's calls OpenAI's ``message.tool_calls`` and ``delta.tool_calls``.

The canonical shapes are OpenAI chat's own, so this is mostly checking; the Responses and
Anthropic dialects build the same canonical messages and fields from theirs. Pure functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ovpool import bounds, tools
from ovpool.completion import Completion
from ovpool.errors import InvalidRequestError
from ovpool.tools import ToolCallDelta

_NO_CHOICE = ("auto", "none")  # tool_choice values that mean nothing without tools


def bad(param: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {why}", param=param)


def sampling(tools: Any, choice: Any, parallel: Any) -> dict[str, Any]:
    """SamplingParams' tool fields of a request (its dialect's names translated already): absent
    ones left out; a tool_choice of "auto" or "none" without tools is dropped, as it asks nothing."""
    out: dict[str, Any] = {}
    if tools is not None and tools != []:
        out["tools"] = tools
    elif choice in _NO_CHOICE:
        choice = None
    if choice is not None:
        out["tool_choice"] = choice
    if parallel is not None:
        out["parallel_tool_calls"] = parallel  # SamplingParams checks it is a bool
    return out


def each_tool(value: Any, tool: Callable[[Any, str], dict], shape: str) -> list[dict[str, Any]] | None:
    """A dialect's ``tools`` list, each as ``tool`` makes it canonical (``shape``: one, for errors)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > tools.MAX_TOOLS:
        raise bad("tools", f"must be a list of at most {tools.MAX_TOOLS} tools {shape}")
    return [tool(t, f"tools[{i}]") for i, t in enumerate(value)]


def body_sampling(body: dict) -> dict[str, Any]:
    """A /v1/chat/completions body's tool fields; the legacy ``functions`` API is refused."""
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise bad(legacy, "the legacy functions API is not supported; send tools and tool_choice")
    return sampling(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))


def history(message: dict, role: str, content: str, where: str) -> dict[str, Any]:
    """A chat message as the core's: an assistant's with ``tool_calls`` (content null when it has
    only calls), a ``tool`` message with its ``tool_call_id``, or {role, content}."""
    if role == "function":
        raise bad(f"{where}.role", "the legacy function role is not supported; send the result as "
                  "{\"role\": \"tool\", \"tool_call_id\": ..., \"content\": ...}")
    if role == "tool":
        return tool_message(message.get("tool_call_id"), content, f"{where}.tool_call_id")
    calls = message.get("tool_calls")
    if role != "assistant" or calls is None or calls == []:
        return {"role": role, "content": content}
    if not isinstance(calls, list) or len(calls) > bounds.MAX_MESSAGES:
        raise bad(f"{where}.tool_calls", f"must be a list of at most {bounds.MAX_MESSAGES} calls "
                  "{\"id\": ..., \"type\": \"function\", \"function\": {\"name\": ..., \"arguments\": ...}}")
    out = [_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)]
    return assistant(content, out)


def assistant(content: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The canonical assistant message of ``content`` and OpenAI-shaped ``calls``."""
    if not calls:
        return {"role": "assistant", "content": content}
    return {"role": "assistant", "content": content or None, "tool_calls": calls}


def tool_message(call_id: Any, content: str, where: str) -> dict[str, Any]:
    """The canonical result of call ``call_id``."""
    return {"role": "tool", "tool_call_id": bounds.text(call_id, where, bounds.MAX_NAME_CHARS),
            "content": content}


def call(call_id: Any, name: Any, arguments: Any, where: str,
         fields: tuple[str, str, str] = ("id", "name", "arguments")) -> dict[str, Any]:
    """One canonical (OpenAI-shaped) call of an assistant message, its parts checked (errors name
    them as the dialect does: ``fields``, below ``where``)."""
    at = [f"{where}.{field}" for field in fields]
    return {"id": bounds.text(call_id, at[0], bounds.MAX_NAME_CHARS), "type": "function",
            "function": {"name": bounds.text(name, at[1], bounds.MAX_NAME_CHARS),
                         "arguments": bounds.text(arguments, at[2])}}


def _call(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get("type", "function") != "function" \
            or not isinstance(value.get("function"), dict):
        raise bad(where, "must be {\"id\": ..., \"type\": \"function\", \"function\": {\"name\": ..., "
                  "\"arguments\": \"<JSON text>\"}}")
    function = value["function"]
    return call(value.get("id"), function.get("name"), function.get("arguments"), where,
                ("id", "function.name", "function.arguments"))


# -- replies ----------------------------------------------------------------------------------


def message(c: Completion) -> dict[str, Any]:
    """A chat choice's ``message``: its text, and its calls (content null when it has only calls)."""
    return assistant(c.text, [call.to_openai() for call in c.tool_calls])


def delta(first: bool, text: str, pieces: tuple[ToolCallDelta, ...]) -> dict[str, Any]:
    """A chunk's ``delta``: the role on a choice's first, the text (null on a first chunk of calls
    only, left out of later ones), each call's id, type and name with its first piece, then its
    argument fragments, as the openai SDK's stream helpers accumulate them by ``index``."""
    out: dict[str, Any] = {"role": "assistant"} if first else {}
    if text or not pieces:
        out["content"] = text
    elif first:
        out["content"] = None
    if pieces:
        out["tool_calls"] = [_piece(p) for p in pieces]
    return out


def _piece(p: ToolCallDelta) -> dict[str, Any]:
    if p.id:
        return {"index": p.index, "id": p.id, "type": "function",
                "function": {"name": p.name, "arguments": p.arguments}}
    return {"index": p.index, "function": {"arguments": p.arguments}}
