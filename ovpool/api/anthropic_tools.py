"""Anthropic's tool use as the core's (chat_tools, ovpool.tools): ``tools`` (name, description,
input_schema) and ``tool_choice`` (auto, any, tool, none; disable_parallel_tool_use) as the
core's fields, a conversation's content blocks (text, tool_use, tool_result) as the canonical
messages, and a Completion's calls as ``tool_use`` blocks. Pure functions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ovpool import bounds
from ovpool.api import chat_tools
from ovpool.api.chat_tools import bad
from ovpool.errors import InvalidRequestError
from ovpool.tools import ToolCall

_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # and {"type": "tool", "name": ...}
_SHAPE = "{\"name\": ..., \"description\": ..., \"input_schema\": {...}}"
_CUSTOM = (None, "custom")  # a client tool's type; any other is one of Anthropic's server tools


def sampling(body: dict) -> dict[str, Any]:
    """The core's tool fields of a /v1/messages body."""
    choice, parallel = _choice(body.get("tool_choice"))
    canonical = chat_tools.each_tool(body.get("tools"), _tool, _SHAPE)
    return chat_tools.sampling(canonical, choice, parallel)


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise bad(where, f"must be {_SHAPE}")
    if tool.get("type") not in _CUSTOM:
        raise bad(f"{where}.type", f"only client tools (type \"custom\" or none) are supported, not "
                  f"Anthropic's server tool {bounds.describe(tool.get('type'))}")
    if not isinstance(tool.get("input_schema"), dict):
        raise bad(f"{where}.input_schema", "is required: the JSON schema of the tool's input")
    out = {"name": tool.get("name"), "description": tool.get("description"),
           "parameters": tool["input_schema"]}
    if tool.get("strict") is not None:
        out["strict"] = tool["strict"]
    return out


def _choice(choice: Any) -> tuple[Any, bool | None]:
    """The core's tool_choice and parallel_tool_calls (None: the default)."""
    if choice is None:
        return None, None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in (*_CHOICES, "tool") or (kind == "tool" and not isinstance(choice.get("name"), str)):
        raise bad("tool_choice", "must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or "
                  f"{{\"type\": \"tool\", \"name\": ...}}, not {bounds.describe(choice)}")
    single = choice.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        raise bad("tool_choice.disable_parallel_tool_use", "must be true or false")
    parallel = None if single is None else not single
    return ({"name": choice["name"]} if kind == "tool" else _CHOICES[kind]), parallel


@contextmanager
def schemas_named() -> Iterator[None]:
    """The core's errors about a tool's ``parameters`` name Anthropic's ``input_schema``."""
    try:
        yield
    except InvalidRequestError as exc:
        if exc.param != "tools" or ".parameters" not in str(exc):
            raise
        named = str(exc).replace(".parameters", ".input_schema", 1)
        raise InvalidRequestError(named, param="tools") from None


# -- the conversation -------------------------------------------------------------------------


def message(role: str, blocks: list, where: str) -> list[dict[str, Any]]:
    """A message's content blocks as canonical messages: a user's tool_result blocks each become
    a tool message (before its text, as Anthropic puts them first); an assistant's tool_use blocks
    its tool_calls."""
    text, calls, results = [], [], []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"{where}[{j}]"
        if kind == "text":
            text.append(bounds.text(block.get("text"), f"{at}.text"))
        elif kind == "tool_use" and role == "assistant":
            calls.append(_use(block, at))
        elif kind == "tool_result" and role == "user":
            results.append(_result(block, at))
        elif kind in ("tool_use", "tool_result"):
            raise bad(at, f"a {kind} block belongs in an {'assistant' if kind == 'tool_use' else 'user'} "
                      "message")
        elif kind in ("image", "document"):
            raise bad(at, f"{kind} blocks are not supported: this server reads text only")
        else:
            raise bad(f"{at}.type", f"must be \"text\", \"tool_use\" or \"tool_result\", got "
                      f"{bounds.describe(kind)}")
    joined = "".join(text)
    if role == "assistant":
        return [chat_tools.assistant(joined, calls)]
    return [*results, *([{"role": "user", "content": joined}] if joined or not results else [])]


def _use(block: dict, where: str) -> dict[str, Any]:
    if not isinstance(block.get("input"), dict):
        raise bad(f"{where}.input", "must be an object: the tool's input")
    return chat_tools.call(block.get("id"), block.get("name"), json.dumps(block["input"]), where)


def _result(block: dict, where: str) -> dict[str, Any]:
    """A tool_result's content (a string or text blocks) as a tool message; an error result says
    so in its text, as the model has no other way to see ``is_error``."""
    content = block.get("content", "")
    if isinstance(content, list):
        content = text_blocks(content, f"{where}.content")
    text = bounds.text(content, f"{where}.content")
    if block.get("is_error") is True:
        text = "Error: " + text
    return chat_tools.tool_message(block.get("tool_use_id"), text, f"{where}.tool_use_id")


def text_blocks(blocks: list, where: str) -> str:
    if len(blocks) > bounds.MAX_MESSAGES:
        raise bad(where, f"{len(blocks)} blocks; at most {bounds.MAX_MESSAGES}")
    parts = []
    for j, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise bad(f"{where}[{j}]", "only text blocks ({\"type\": \"text\", \"text\": ...}) are supported")
        parts.append(bounds.text(block.get("text"), f"{where}[{j}].text"))
    return "".join(parts)


# -- replies ----------------------------------------------------------------------------------


def use_id(call_id: str) -> str:
    """A call's id as Anthropic writes one: ``toolu_`` and the core's id's own letters."""
    return "toolu_" + call_id.removeprefix("call_")


def use_block(call: ToolCall) -> dict[str, Any]:
    """A call as a ``tool_use`` content block (its input the arguments' JSON object)."""
    return {"type": "tool_use", "id": use_id(call.id), "name": call.name, "input": _input(call.arguments)}


def _input(arguments: str) -> Any:
    """The arguments' object; a worker's text that is not one (a peer's fault: arguments are
    valid by construction) is kept as its text rather than failing the reply."""
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"arguments": arguments}
