"""How a model is asked for tool calls and held to them: its template's family, the prompt's tools
and history, and the llguidance grammar of a valid reply (docs/tools.md).

Three families, found in the chat template as llama.cpp's common/chat.cpp finds them:

- ``hermes`` (Qwen2.5, Qwen3, Hermes 2 Pro: a template that writes ``<tool_call>``): the template
  renders the tools itself (its ``tools`` variable); a call is
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, calls one per line.
- ``llama3`` (Llama 3.1-3.3: a template with an ``ipython`` role): the template renders the tools
  (in its system turn); a call is the JSON ``{"name": ..., "parameters": {...}}``, one per reply.
- ``generic`` (every other template, SmolLM2's among them): a system message describes the tools,
  and the reply is one JSON object, ``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}``
  or ``{"response": "..."}`` (llama.cpp's generic handler; its history is written the same way).

The grammar holds the name to a declared one and the arguments to that function's ``parameters``
schema (``strict`` or not); ``auto`` leaves hermes text free until ``<tool_call>`` begins (a lazy
lexeme), ``required`` and a named choice admit calls only, ``parallel_tool_calls`` false one call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ovpool.sampling_params import SamplingParams

HERMES, LLAMA3, GENERIC = "hermes", "llama3", "generic"
# One layout for a call's JSON, the one templates write calls in (tojson: Python's json.dumps):
# a model spends no tokens on whitespace, and its calls read as the history shows them.
_WHITESPACE = {"x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}
_SUBSCHEMAS = {"items", "anyOf", "oneOf", "prefixItems"}
_SCHEMA_MAPS = {"properties", "$defs", "definitions"}  # maps of names to schemas
_OPEN_KEYS = {"additionalProperties", "patternProperties", "unevaluatedProperties"}
OPEN, CLOSE = "<tool_call>", "</tool_call>"
LLAMA3_OPEN = '{"name": "'  # a llama3 call's beginning (llama.cpp's trigger, in this layout)
# ARGUMENTS[family]: the key of a call's arguments in its JSON.
ARGUMENTS = {HERMES: "arguments", LLAMA3: "parameters", GENERIC: "arguments"}


def family(template: str | None) -> str:
    """The tool-call family of a chat template."""
    if template and "<|start_header_id|>ipython<|end_header_id|>" in template:
        return LLAMA3
    return HERMES if template and OPEN in template and "tools" in template else GENERIC


def prepare(kind: str, messages: Sequence[Mapping[str, Any]], params: SamplingParams | None
            ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages to render and the template's extra variables: the history's tool calls and
    results in the family's form, and the tools where the reply may call them."""
    tools = params.tools if params is not None and params.calls_tools else None
    if kind in (HERMES, LLAMA3):
        extra = {"tools": [_openai(t) for t in tools]} if tools else {}
        if kind == LLAMA3:  # in the system turn, as llama.cpp renders them
            extra["tools_in_user_message"] = False
        return [_hermes_message(m) for m in messages], extra
    out = _generic_history(messages)
    return (_with_system(out, _generic_instructions(tools, params.tool_choice)) if tools else out), {}


def grammar(kind: str, params: SamplingParams) -> str:
    """The Lark grammar (llguidance's) of a reply to ``params``, which calls tools."""
    tools = _chosen(params)
    if kind == GENERIC:
        return "%llguidance {}\nstart: %json " + json.dumps(_generic_schema(tools, params))
    if kind == LLAMA3:
        return _llama3_grammar(tools, params)
    fns = " | ".join(f"fn_{i}" for i in range(len(tools)))
    more = ' ("\\n" "<tool_call>" body)*' if params.parallel_tool_calls else ""
    rules = [
        "%llguidance {}",
        "start: calls" if params.tool_choice != "auto" else "start: TEXT | head body" + more + ' "\\n"?',
        f'calls: "{OPEN}" body{more} "\\n"?',
        f"head[lazy]: TEXT \"{OPEN}\"",
        f'body: "\\n" fn "\\n{CLOSE}"',
        f"fn: {fns}",
        *(f"fn_{i}: %json {json.dumps(call_schema(t) | _WHITESPACE)}" for i, t in enumerate(tools)),
        r"TEXT: /(.|\n)*/",
    ]
    return "\n".join(rules) + "\n"


def _llama3_grammar(tools: list[dict[str, Any]], params: SamplingParams) -> str:
    """One call: ``{"name": "NAME", "parameters": ARGS}``, after free text with ``auto``."""
    opening = json.dumps(LLAMA3_OPEN)
    rules = [
        "%llguidance {}",
        "start: TEXT | head fn" if params.tool_choice == "auto" else f"start: {opening} fn",
        f"head[lazy]: TEXT {opening}",
        "fn: " + " | ".join(f"fn_{i}" for i in range(len(tools))),
        *(f"fn_{i}: {json.dumps(_llama3_rest(t))} %json {json.dumps(closed(t['parameters']) | _WHITESPACE)}"
          ' "}"' for i, t in enumerate(tools)),
        r"TEXT: /(.|\n)*/",
    ]
    return "\n".join(rules) + "\n"


def _llama3_rest(tool: Mapping[str, Any]) -> str:
    """A llama3 call's text between its opening and its arguments."""
    return f'{tool["name"]}", "parameters": '


def call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    """One call of ``tool`` as a JSON object: its name, then arguments of its parameters."""
    return {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
            "properties": {"name": {"const": tool["name"]}, "arguments": closed(tool["parameters"])}}


def closed(schema: Any) -> Any:
    """``schema`` with every object that lists its ``properties`` and says nothing of others
    closed to them (``additionalProperties: false``, as OpenAI's strict mode requires): a small
    model otherwise writes the schema's own keys into its arguments. What it admits is a subset
    of what ``schema`` admits, so every call still validates against the declared schema. Beside
    an ``allOf`` (whose parts add properties) nothing is closed."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict) or "allOf" in schema:
        return schema
    out = {k: closed(v) if k in _SUBSCHEMAS else v for k, v in schema.items()}
    for key in _SCHEMA_MAPS & set(out):
        if isinstance(out[key], dict):
            out[key] = {name: closed(v) for name, v in out[key].items()}
    if isinstance(out.get("properties"), dict):
        if not _OPEN_KEYS & set(out):
            out["additionalProperties"] = False
    return out


def _chosen(params: SamplingParams) -> list[dict[str, Any]]:
    choice = params.tool_choice
    if isinstance(choice, dict):
        return [t for t in params.tools if t["name"] == choice["name"]]
    return params.tools


def _generic_schema(tools: list[dict[str, Any]], params: SamplingParams) -> dict[str, Any]:
    calls = [call_schema(t) for t in tools]
    items = calls[0] if len(calls) == 1 else {"anyOf": calls}
    array = {"type": "array", "items": items, "minItems": 1}
    if not params.parallel_tool_calls:
        array["maxItems"] = 1
    reply = {"type": "object", "additionalProperties": False, "required": ["tool_calls"],
             "properties": {"tool_calls": array}}
    if params.tool_choice == "auto":
        text = {"type": "object", "additionalProperties": False, "required": ["response"],
                "properties": {"response": {"type": "string"}}}
        reply = {"anyOf": [reply, text]}
    return reply | _WHITESPACE


def _openai(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A canonical tool as chat templates expect it (Hugging Face passes OpenAI's shape)."""
    return {"type": "function", "function": {"name": tool["name"], "description": tool["description"],
                                             "parameters": tool["parameters"]}}


def _arguments(text: Any) -> Any:
    """A history call's arguments for a template, which writes them with ``tojson``: the object
    its JSON text holds (a text that is not JSON stays as it is)."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _hermes_message(message: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(message)
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {**c, "function": {**c["function"], "arguments": _arguments(c["function"]["arguments"])}}
            for c in message["tool_calls"]]
        out["content"] = message.get("content") or ""
    return out


def _generic_history(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Calls as the generic reply object; results as user messages (as minja's polyfill writes
    them: a template without tools may refuse a ``tool`` role)."""
    names: dict[str, str] = {}
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])}
                     for c in m["tool_calls"]]
            names.update((c.get("id", ""), c["function"]["name"]) for c in m["tool_calls"])
            reply = json.dumps({"tool_calls": calls}, ensure_ascii=False)
            out.append({"role": "assistant", "content": reply})
        elif m.get("role") == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id", ""), "")
            result = {"tool_response": {"tool": name, "content": m.get("content") or ""}}
            out.append({"role": "user", "content": json.dumps(result, ensure_ascii=False)})
        else:
            out.append(dict(m))
    return out


def _generic_instructions(tools: list[dict[str, Any]], choice: Any) -> str:
    listed = json.dumps([{"name": t["name"], "description": t["description"], "parameters": t["parameters"]}
                         for t in tools], ensure_ascii=False)
    call = '{"tool_calls": [{"name": "<tool name>", "arguments": {<its arguments>}}]}'
    if choice == "auto":
        how = f'either {call} to call tools, or {{"response": "<your reply>"}} to answer the user directly'
    elif isinstance(choice, dict):
        how = f'{call}, calling the tool {choice["name"]}'
    else:
        how = f"{call}, calling one or more of the tools"
    return (f"You can call these tools (each with a JSON schema of its arguments):\n{listed}\n"
            f"Respond with one JSON object: {how}.")


def _with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        return [{**first, "content": f"{first.get('content') or ''}\n\n{text}".lstrip()}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
