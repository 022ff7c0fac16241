"""The Responses API's function calling as the core's (chat_tools, ovpool.tools): its flat
function ``tools`` and ``tool_choice`` as the core's fields, ``function_call`` and
``function_call_output`` input items as the canonical messages, and a Completion's calls as
``function_call`` output items; the request's tools and choice echoed in the response object.
Pure functions.
"""

from __future__ import annotations

from typing import Any

from ovpool import bounds
from ovpool.api import chat_tools
from ovpool.api.chat_tools import bad
from ovpool.api.schema import Generate
from ovpool.tools import ToolCall

_CHOICES = ("none", "auto", "required")
_TEXT_PARTS = ("input_text", "output_text")
_SHAPE = "{\"type\": \"function\", \"name\": ..., \"parameters\": {...}}"


def sampling(body: dict) -> dict[str, Any]:
    """The core's tool fields of a /v1/responses body."""
    canonical = chat_tools.each_tool(body.get("tools"), _tool, _SHAPE)
    return chat_tools.sampling(canonical, _choice(body.get("tool_choice")), body.get("parallel_tool_calls"))


def _tool(tool: Any, where: str) -> dict[str, Any]:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        raise bad(f"{where}.type", f"only function tools ({_SHAPE}) are supported, "
                  f"not {bounds.describe(kind)}")
    out = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    out["strict"] = True if tool.get("strict") is None else tool["strict"]  # the Responses API's default
    return out


def _choice(choice: Any) -> Any:
    if choice is None or choice in _CHOICES:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"name": choice["name"]}
    raise bad("tool_choice", f"must be one of {list(_CHOICES)} or {{\"type\": \"function\", \"name\": ...}}, "
              f"not {bounds.describe(choice)}")


# -- input items ------------------------------------------------------------------------------


def call_item(item: dict, where: str, messages: list[dict[str, Any]]) -> None:
    """A function_call item: a call of the assistant message before it, or of a new one."""
    call = chat_tools.call(item.get("call_id"), item.get("name"), item.get("arguments"), where,
                           ("call_id", "name", "arguments"))
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        messages[-1] = chat_tools.assistant(last["content"] or "", [*last.get("tool_calls", ()), call])
    else:
        messages.append(chat_tools.assistant("", [call]))


def output_item(item: dict, where: str) -> dict[str, Any]:
    """A function_call_output item as the canonical tool message."""
    output = item.get("output")
    if isinstance(output, list):
        output = "".join(text_part(part, f"{where}.output[{j}]") for j, part in enumerate(output))
    return chat_tools.tool_message(item.get("call_id"), bounds.text(output, f"{where}.output"),
                                   f"{where}.call_id")


def text_part(part: Any, where: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in _TEXT_PARTS:
        raise bad(where, f"only text parts ({', '.join(_TEXT_PARTS)}) are supported, got "
                  f"{bounds.describe(kind)}")
    return bounds.text(part.get("text"), f"{where}.text")


# -- the response -----------------------------------------------------------------------------


def item_id(call_id: str) -> str:
    """A function_call item's id: ``fc_`` and its call id's own letters."""
    return "fc_" + call_id.removeprefix("call_")


def call_output(call: ToolCall, status: str = "completed") -> dict[str, Any]:
    """A call as a ``function_call`` output item."""
    return {"type": "function_call", "id": item_id(call.id), "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}


def echoed(gen: Generate) -> dict[str, Any]:
    """The response object's ``tools``, ``tool_choice`` and ``parallel_tool_calls``: the request's."""
    sampling = gen.choices[0].sampling
    choice = sampling.get("tool_choice") or "auto"
    return {"tools": [{"type": "function", **tool} for tool in sampling.get("tools") or ()],
            "tool_choice": {"type": "function", **choice} if isinstance(choice, dict) else choice,
            "parallel_tool_calls": sampling.get("parallel_tool_calls", True)}
