"""The constraint a request's output must meet (``SamplingParams.response_format``): its shapes on
the wire, normalised, and its check at submit.

Accepted (OpenAI's shapes included, so an HTTP layer passes them through)::

    {"type": "json_schema", "schema": {...}}                          # or OpenAI's:
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}
    {"type": "json_object"}                                           # any JSON object
    {"type": "regex", "pattern": "..."}
    {"type": "grammar", "lark": "..."}  or  {"type": "grammar", "gbnf": "..."}
    {"type": "text"}  or  None                                        # no constraint

``normalize`` keeps one form per kind: ``{"type": "json_schema", "schema": ...}``, ``{"type":
"json_object"}``, ``{"type": "regex", "pattern": ...}``, ``{"type": "grammar", "lark"|"gbnf": ...}``.
It also compiles the constraint with llguidance (without a vocabulary: milliseconds), so a malformed
or unsatisfiable one is an InvalidRequestError where the request is made: in the client, again at
the broker, before any worker is busy. llguidance is imported only for a request that has a
constraint (its import takes time: docs/performance.md), so a client without one never pays it.
"""

from __future__ import annotations

from typing import Any

from ovpool import bounds
from ovpool.errors import InvalidRequestError

# Whitespace between JSON tokens: a space, or a newline and up to 20 spaces or tabs of indent, as
# llama.cpp's JSON-schema grammar allows. Unbounded whitespace (llguidance's default) lets a model
# spend its max_tokens on it; this keeps the layouts SmolLM2 writes by itself. A schema's own
# "x-guidance" options override it.
_JSON_OPTIONS = {"whitespace_pattern": r"(?: |\n[ \t]{0,20})?"}
_FIELDS = {"json_schema": ("schema", "json_schema"), "json_object": (), "regex": ("pattern",),
           "grammar": ("lark", "gbnf"), "text": ()}

_NAMES = {"json_schema": "JSON schema", "json_object": "JSON object", "regex": "regex",
          "grammar": "grammar"}


def normalize(fmt: Any) -> dict[str, Any] | None:
    """The canonical form of ``fmt`` (None: unconstrained); raises InvalidRequestError naming the
    problem, also when llguidance finds the schema, regex or grammar malformed or unsatisfiable."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or type(fmt.get("type")) is not str or fmt["type"] not in _FIELDS:
        given = f'type {bounds.describe(fmt.get("type"))}' if isinstance(fmt, dict) else bounds.describe(fmt)
        raise _invalid(f"must be a map with a \"type\" of {sorted(_FIELDS)}, not {given}")
    # What llguidance and msgpack can take, before either sees it: no int past 64 bits, no bytes,
    # no lone surrogate, no NaN, bounded depth and size (bounds.MAX_FORMAT_SIZE).
    bounds.json_value(fmt, "response_format")
    kind = fmt["type"]
    extra = set(fmt) - {"type", *_FIELDS[kind]}
    if extra:
        raise _invalid(f"{kind} takes {list(_FIELDS[kind]) or 'no other field'}, not {sorted(extra)}")
    if kind == "text":
        return None
    canonical = {"json_schema": _json_schema, "json_object": lambda _: {"type": "json_object"},
                 "regex": _regex, "grammar": _grammar}[kind](fmt)
    check(canonical)
    return canonical


def grammar(fmt: dict[str, Any]) -> str:
    """The llguidance grammar of a canonical ``fmt``."""
    import llguidance

    kind = fmt["type"]
    if kind in ("json_schema", "json_object"):
        schema = fmt["schema"] if kind == "json_schema" else {"type": "object"}
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(fmt["pattern"])
    syntax = "lark" if "lark" in fmt else "gbnf"
    try:
        return llguidance.grammar_from(syntax, fmt[syntax])
    except ValueError as exc:  # a GBNF text its converter cannot read
        raise _invalid(str(exc)) from exc


def check(fmt: dict[str, Any]) -> None:
    """Raise InvalidRequestError with llguidance's message when ``fmt`` does not compile."""
    import llguidance

    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar(fmt))
    if is_error:
        raise _invalid(f"the {_NAMES[fmt['type']]} is not usable: {messages[0]}")


def _json_schema(fmt: dict[str, Any]) -> dict[str, Any]:
    if ("schema" in fmt) == ("json_schema" in fmt):
        raise _invalid('json_schema needs exactly one of "schema" or OpenAI\'s "json_schema": '
                       '{"name": ..., "schema": {...}}')
    schema = fmt.get("schema")
    if "json_schema" in fmt:
        inner = fmt["json_schema"]
        if not isinstance(inner, dict) or "schema" not in inner:
            raise _invalid('"json_schema" must be a map with a "schema" (OpenAI\'s shape)')
        schema = inner["schema"]
    if not isinstance(schema, dict):
        raise _invalid(f"a JSON schema must be a map, not {type(schema).__name__}")
    return {"type": "json_schema", "schema": schema}


def _regex(fmt: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(fmt.get("pattern"), str):
        raise _invalid('regex needs a "pattern" string')
    return {"type": "regex", "pattern": fmt["pattern"]}


def _grammar(fmt: dict[str, Any]) -> dict[str, Any]:
    given = [k for k in ("lark", "gbnf") if k in fmt]
    if len(given) != 1 or not isinstance(fmt[given[0]], str):
        raise _invalid('grammar needs one "lark" or "gbnf" string')
    return {"type": "grammar", given[0]: fmt[given[0]]}


def _invalid(why: str) -> InvalidRequestError:
    return InvalidRequestError(f"response_format: {why}", param="response_format")
