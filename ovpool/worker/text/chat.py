"""Chat prompts: the model's ``tokenizer.chat_template`` rendered with Jinja2 the way Hugging Face
``apply_chat_template`` does (sandboxed, trim_blocks/lstrip_blocks, ``raise_exception``,
``strftime_now``, a ``tojson`` that keeps non-ASCII text).

A model without a template cannot chat: ``render`` raises InvalidRequestError saying so rather
than guessing a format the model was not trained on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ovpool.errors import InvalidRequestError, ModelFormatError

if TYPE_CHECKING:
    import jinja2

TEMPLATE_KEY = "tokenizer.chat_template"


class _TemplateRaised(Exception):
    """A template's own ``raise_exception(...)``: the messages broke one of its rules."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    # Imported here: Jinja2 costs start-up time (docs/performance.md) and only chat requests need it.
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateError as exc:
        raise ModelFormatError(f"{TEMPLATE_KEY} is not a valid Jinja2 template: {exc}") from exc


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """Messages as a list of dicts with string ``role`` and ``content``, or a clear error."""
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of {'role': ..., 'content': ...}")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"messages[{i}] must be a mapping with 'role' and 'content'")
        if not isinstance(message.get("role"), str):
            raise InvalidRequestError(f"messages[{i}]['role'] must be a string")
        # An assistant's message of tool calls (OpenAI's shape) may have no content.
        if not isinstance(message.get("content"), str) and not (
                message.get("content") is None and message.get("tool_calls")):
            raise InvalidRequestError(f"messages[{i}]['content'] must be a string")
        checked.append(dict(message))
    return checked


def render(template: str | None, messages: Any, add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "", **extra: Any) -> str:
    """The prompt text for ``messages``; ``extra`` reaches the template as variables (e.g. tools)."""
    if not template:
        raise InvalidRequestError(
            f"this model has no chat template ({TEMPLATE_KEY} is missing from its GGUF metadata); "
            "send a plain prompt instead of messages")
    compiled = _compile(template)
    import jinja2  # already loaded by _compile

    try:
        return compiled.render(messages=check_messages(messages),
                               add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, **extra)
    except _TemplateRaised as exc:
        raise InvalidRequestError(f"the model's chat template rejected the messages: {exc}") from exc
    except jinja2.TemplateError as exc:
        raise ModelFormatError(f"{TEMPLATE_KEY} failed to render: {exc}") from exc
