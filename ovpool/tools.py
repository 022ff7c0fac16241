"""Tool calling's shapes on the wire (``SamplingParams.tools``, ``tool_choice``,
``parallel_tool_calls``), normalised and checked once where a request is made, and the calls a
generation returns (docs/tools.md).

Accepted (OpenAI's shape, and the canonical one so that the wire round-trips)::

    tools:        [{"type": "function", "function": {"name": ..., "description": ...,
                    "parameters": {...JSON schema...}, "strict": ...}}, ...]
                  or [{"name": ..., "description": ..., "parameters": {...}, "strict": ...}, ...]
    tool_choice:  "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}
                  | {"name": ...}          (default: "auto" with tools)
    parallel_tool_calls: true | false      (default true: any number of calls in one reply)

``normalize_tools`` keeps one form, ``{"name", "description", "parameters", "strict"}``, and
compiles every ``parameters`` schema with llguidance (as ovpool.response_format does), so a
schema the worker could not enforce is an InvalidRequestError where the request is made.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ovpool import bounds
from ovpool.errors import InvalidRequestError, MalformedMessageError

MAX_TOOLS = 128             # OpenAI's cap on tools per request
MAX_DESCRIPTION_CHARS = 4096
CHOICES = ("none", "auto", "required")
EMPTY_PARAMETERS = {"type": "object", "properties": {}}
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_TOOL_FIELDS = {"name", "description", "parameters", "strict"}


def normalize_tools(tools: Any) -> list[dict[str, Any]] | None:
    """The canonical tools (None: no tools; an empty list counts as none), or InvalidRequestError
    naming the tool and the field."""
    if tools is None or (isinstance(tools, list | tuple) and not tools):
        return None
    if not isinstance(tools, list | tuple) or len(tools) > MAX_TOOLS:
        raise _invalid("tools", f"must be a list of at most {MAX_TOOLS} function tools, "
                                f"not {bounds.describe(tools)}")
    bounds.json_value(list(tools), "tools")
    out = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    names = [t["name"] for t in out]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise _invalid("tools", f"the function name {duplicate!r} is declared twice; names must be unique")
    return out


def normalize_choice(choice: Any, tools: list[dict[str, Any]] | None) -> str | dict[str, str] | None:
    """The canonical tool_choice: None without tools, else "none", "auto", "required" or
    {"name": NAME} of a declared tool."""
    if tools is None:
        if choice in (None, "none"):
            return None
        raise _invalid("tool_choice", "is only allowed when tools are given")
    if choice is None:
        return "auto"
    if isinstance(choice, str) and choice in CHOICES:
        return choice
    name = _chosen_name(choice)
    if name is None:
        raise _invalid("tool_choice", f'must be one of {list(CHOICES)} or {{"type": "function", '
                                      f'"function": {{"name": ...}}}}, not {bounds.describe(choice)}')
    if name not in {t["name"] for t in tools}:
        raise _invalid("tool_choice", f"names the function {name!r}, which is not among the tools "
                                      f"{[t['name'] for t in tools][:16]}")
    return {"name": name}


def check_with_format(tools: list | None, choice: Any, response_format: dict | None) -> None:
    """Tools and a response_format cannot both hold the output (unless tool_choice is "none")."""
    if tools is not None and response_format is not None and choice != "none":
        raise _invalid("response_format", "cannot be combined with tools (the reply is either a tool "
                                          'call or text of that format); drop one, or set tool_choice "none"')


def check_chat(calls_tools: bool, is_chat: bool) -> None:
    """Tools reach a model through its chat template: a request with a plain prompt cannot call them."""
    if calls_tools and not is_chat:
        raise _invalid("tools", "need chat messages (the model's chat template renders the tools), "
                                "not a plain prompt; send the prompt as a user message")


def _chosen_name(choice: Any) -> str | None:
    if not isinstance(choice, dict):
        return None
    if set(choice) <= {"type", "function"} and choice.get("type") == "function" \
            and isinstance(choice.get("function"), dict):
        choice = choice["function"]
    return choice.get("name") if set(choice) == {"name"} and isinstance(choice.get("name"), str) else None


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if isinstance(tool, dict) and "type" in tool:
        if tool["type"] != "function" or set(tool) != {"type", "function"} or \
                not isinstance(tool["function"], dict):
            given = bounds.describe(tool["type"])
            raise _invalid(where, 'must be {"type": "function", "function": {"name": ..., "parameters": '
                                  f"...}}}} (only function tools are supported), not type {given}")
        tool = tool["function"]
    if not isinstance(tool, dict):
        raise _invalid(where, f"must be a map, not {bounds.describe(tool)}")
    extra = set(tool) - _TOOL_FIELDS
    if extra:
        raise _invalid(where, f"takes {sorted(_TOOL_FIELDS)}, not {sorted(extra)}")
    name = tool.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _invalid(f"{where}.name", "must be 1 to 64 letters, digits, _ or -, "
                                        f"not {bounds.describe(name)}")
    description = tool.get("description") or ""
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
        raise _invalid(f"{where}.description",
                       f"must be a string of at most {MAX_DESCRIPTION_CHARS} characters")
    parameters = tool.get("parameters") or dict(EMPTY_PARAMETERS)
    if not isinstance(parameters, dict):
        raise _invalid(f"{where}.parameters",
                       f"must be a JSON schema (a map), not {bounds.describe(parameters)}")
    strict = tool.get("strict")
    if strict is not None and type(strict) is not bool:
        raise _invalid(f"{where}.strict", "must be true, false or null")
    _check_schema(parameters, f"{where}.parameters")
    return {"name": name, "description": description, "parameters": parameters, "strict": bool(strict)}


def _check_schema(schema: dict, where: str) -> None:
    """InvalidRequestError with llguidance's message when the schema does not compile."""
    why = _PROBLEMS.problem(json.dumps(schema, sort_keys=True))
    if why:
        raise _invalid(where, f"is not a usable JSON schema: {why}")


class _Problems:
    """``_schema_problem`` of the last ``size`` schema texts, by their sha256: an agent sends the
    same tools every turn, and each request is checked in the client, the broker and the worker
    (3-4 ms for 10 tools each time, uncached). Keyed by digest, not by text: a text may be a
    mebibyte, and a peer could send hundreds of different ones."""

    def __init__(self, size: int):
        self.size, self._lock, self._known = size, threading.Lock(), OrderedDict()

    def problem(self, schema: str) -> str:
        key = hashlib.sha256(schema.encode()).digest()
        with self._lock:
            if key in self._known:
                self._known.move_to_end(key)
                return self._known[key]
        why = _schema_problem(schema)
        with self._lock:
            self._known[key] = why
            if len(self._known) > self.size:
                self._known.popitem(last=False)
        return why

    def clear(self) -> None:
        with self._lock:
            self._known.clear()


_PROBLEMS = _Problems(512)


def _schema_problem(schema: str) -> str:
    """Why llguidance cannot compile the JSON schema ``schema`` ("" if it can)."""
    import llguidance

    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    except ValueError as exc:
        return str(exc)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return messages[0] if is_error else ""


def _invalid(param: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {why}", param=param.split("[")[0].split(".")[0])


def new_call_id() -> str:
    """A fresh tool call id, OpenAI's form: ``call_`` and 24 letters and digits."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class ToolCall:
    """One call a generation made: its id, the declared function's name and its arguments as a
    JSON text (an object valid for that function's ``parameters``, by construction)."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's ``message.tool_calls[i]`` (and a history message's)."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}

    def parsed_arguments(self) -> Any:
        return json.loads(self.arguments)

    @classmethod
    def from_dict(cls, d: Any, where: str = "tool_calls") -> ToolCall:
        """From an untrusted peer: three strings, or MalformedMessageError."""
        if type(d) is not dict or not all(type(d.get(k)) is str for k in ("id", "name", "arguments")):
            raise MalformedMessageError(f"{where} must be a map of id, name and arguments strings")
        return cls(d["id"], d["name"], d["arguments"])


@dataclass(frozen=True)
class ToolCallDelta:
    """A streamed piece of call ``index`` (0, 1, ... in the reply): the first piece of a call has
    its ``id`` and ``name`` (and ``arguments`` ""), the later ones ``arguments`` text only (id and
    name ""); a call's pieces' ``arguments`` joined are its ToolCall.arguments. OpenAI's
    ``delta.tool_calls[i]`` is one of these."""

    index: int
    id: str
    name: str
    arguments: str

    def to_wire(self) -> list:
        return [self.index, self.id, self.name, self.arguments]

    @classmethod
    def list_from_wire(cls, ws: Any, where: str = "tool_calls") -> tuple[ToolCallDelta, ...]:
        if ws == []:
            return ()
        if type(ws) is not list or not all(
                type(w) is list and len(w) >= 4 and type(w[0]) is int and all(type(x) is str for x in w[1:4])
                for w in ws):
            raise MalformedMessageError(f"{where} must be a list of [index, id, name, arguments]")
        return tuple(cls(*w[:4]) for w in ws)
