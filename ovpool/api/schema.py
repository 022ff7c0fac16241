"""OpenAI request bodies as ovpool requests: every field checked once, with the field's name.

Pure functions on the body's bytes and parsed JSON. Unknown fields are ignored, as OpenAI's API
does; a known field with a bad value raises InvalidRequestError naming it (``param``), which the
app answers with 400. The bounds are ovpool.bounds'; the sampling fields are SamplingParams' own
(built once here, so a bad one is refused before any choice is sent).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ovpool import bounds, keep_alive
from ovpool.api import chat_tools
from ovpool.api.chat_tools import bad
from ovpool.bounds import MAX_CHOICES, MAX_JSON_DEPTH, MAX_LOGPROBS
from ovpool.errors import InvalidRequestError
from ovpool.protocol import MAX_MESSAGE_BYTES
from ovpool.sampling_params import SamplingParams

MAX_BODY_BYTES = MAX_MESSAGE_BYTES  # a request body: at most what one broker message may hold
# OpenAI's default for /v1/completions; chat defaults to the server's max_new_tokens.
COMPLETION_MAX_TOKENS = 16
# Body fields that are SamplingParams fields of the same name and meaning: passed as given.
_SAMPLING = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
             "stop", "logit_bias", "ignore_eos", "response_format")


@dataclass(frozen=True)
class Choice:
    """One generation to run: its index in the response, its prompt (text or chat messages),
    SamplingParams keyword arguments, and the SamplingParams they make (built once, here)."""

    index: int
    prompt: str | list[dict[str, Any]]
    sampling: dict[str, Any]
    params: SamplingParams


@dataclass(frozen=True)
class Generate:
    """A validated /v1/completions or /v1/chat/completions request."""

    chat: bool
    model: str
    choices: list[Choice]
    n: int = 1  # choices per prompt: choice i*n + j is prompt i's j-th
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    logprobs: int | None = None  # None: not asked for; else how many top alternatives per token
    timeout: float | None = None
    keep_alive: float | None = None  # seconds (ovpool.keep_alive; -1: never); None: the model's own


def parse_json(raw: bytes) -> Any:
    """A request body's JSON; malformed or nested over bounds.MAX_JSON_DEPTH is a 400. Nesting is
    at most the count of brackets, so only a body with that many is walked (iteratively)."""
    try:
        body = json.loads(raw)
    except RecursionError:  # the C decoder's own guard, deeper than Python's recursion limit
        raise InvalidRequestError(f"the request body nests more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an int over 4,300 digits
        raise InvalidRequestError(f"the request body is not valid JSON: {str(exc)[:200]}") from None
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH:
        bounds.depth(body)
    return body


def parse_chat(body: Any, max_tokens: int) -> Generate:
    """A /v1/chat/completions body; ``max_tokens`` is the default when the body gives none."""
    body = body_object(body)
    messages = chat_messages(body.get("messages"))
    tokens = _int(body, "max_completion_tokens", 1, bounds.MAX_TOKENS) or \
        _int(body, "max_tokens", 1, bounds.MAX_TOKENS) or max_tokens
    top = _int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if not _bool(body, "logprobs"):
        if top is not None:
            raise bad("top_logprobs", "needs logprobs: true")
        return _generate(body, True, [messages], tokens, None, echo=False)
    return _generate(body, True, [messages], tokens, top or 0, echo=False)


def parse_completion(body: Any) -> Generate:
    """A /v1/completions body."""
    body = body_object(body)
    tokens = _int(body, "max_tokens", 1, bounds.MAX_TOKENS) or COMPLETION_MAX_TOKENS
    echo = bool(_bool(body, "echo"))
    logprobs = _int(body, "logprobs", 0, MAX_LOGPROBS)
    if echo and logprobs is not None:
        raise bad("echo", "echo with logprobs (log-probabilities of the prompt) is not supported")
    return _generate(body, False, _prompts(body.get("prompt")), tokens, logprobs, echo)


def _generate(body: dict, chat: bool, prompts: list, max_tokens: int, logprobs: int | None,
              echo: bool) -> Generate:
    model = body.get("model")
    if type(model) is not str:
        raise bad("model", "must be a string naming a served model (GET /v1/models lists them)")
    bounds.text(model, "model", bounds.MAX_NAME_CHARS)
    n = _int(body, "n", 1, MAX_CHOICES) or 1
    if n * len(prompts) > MAX_CHOICES:
        raise bad("n", f"n × prompts = {n * len(prompts)} choices; at most {MAX_CHOICES}")
    tokens_param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    bounds.request_tokens(n * len(prompts), max_tokens, tokens_param)
    bounds.logprob_entries(n * len(prompts), max_tokens, logprobs)
    stream = bool(_bool(body, "stream"))
    base = {"max_tokens": max_tokens, **_sampling(body), **(chat_tools.body_sampling(body) if chat else {})}
    if logprobs is not None:
        base["logprobs"] = logprobs
    return Generate(chat, model, _choices(base, prompts, n), n, stream, _include_usage(body, stream), echo,
                    logprobs, _timeout(body), keep_alive.parse(body.get("keep_alive")))


def _choices(base: dict[str, Any], prompts: list, n: int) -> list[Choice]:
    """n choices per prompt from the SamplingParams arguments ``base``, checked once here (the
    client sends these SamplingParams as they are); with a seed, choice j of a prompt has seed + j."""
    seed = base.pop("seed", None)
    params = SamplingParams.from_dict(base)  # shared by requests alike (most are)
    for name in ("response_format", "tools", "tool_choice"):  # canonical, as the params hold them
        base.pop(name, None)
        if getattr(params, name) is not None:
            base[name] = getattr(params, name)
    seeds = [None if seed is None else (seed + j) % bounds.SEED_RANGE for j in range(n)]
    seeded = [params if s is None else params.with_seed(s) for s in seeds]
    return [Choice(i * n + j, prompt, {**base, "seed": seeds[j]}, seeded[j])
            for i, prompt in enumerate(prompts) for j in range(n)]


def _sampling(body: dict) -> dict[str, Any]:
    """SamplingParams keyword arguments from the body's sampling fields (OpenAI's defaults)."""
    out: dict[str, Any] = {"temperature": 1.0}  # OpenAI samples unless told otherwise
    out.update((name, body[name]) for name in _SAMPLING if body.get(name) is not None)
    top_k = _int(body, "top_k", -1, bounds.MAX_TOP_K)
    if top_k is not None:
        out["top_k"] = max(top_k, 0)  # vLLM's -1 and 0 both mean no top-k filter
    seed = _int(body, "seed", -bounds.SEED_RANGE, bounds.SEED_RANGE - 1)
    if seed is not None:
        out["seed"] = seed % bounds.SEED_RANGE
    return out


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI chat messages as the core's: {role, content} strings (text parts joined; other parts
    refused), an assistant's tool_calls and a tool message's tool_call_id (chat_tools.history)."""
    if not isinstance(messages, list) or not 1 <= len(messages) <= bounds.MAX_MESSAGES:
        raise bad("messages", f"must be a list of 1 to {bounds.MAX_MESSAGES} "
                  "{\"role\": ..., \"content\": ...}")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad(f"messages[{i}]", "must be an object with a string role")
        if message.get("name") is not None:  # not rendered, but OpenAI's: checked like the rest
            bounds.text(message["name"], f"messages[{i}].name", bounds.MAX_NAME_CHARS)
        content = _content(message.get("content"), i)
        out.append(chat_tools.history(message, message["role"], content, f"messages[{i}]"))
    return bounds.messages(out)


def _content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""  # an assistant turn without text
    if isinstance(content, list):
        parts = []
        for part in content:
            text = part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None
            if not isinstance(text, str):
                raise bad(f"messages[{i}].content", "only text parts ({\"type\": \"text\", \"text\": ...}) "
                          "are supported")
            parts.append(text)
        return "".join(parts)
    raise bad(f"messages[{i}].content", "must be a string or a list of text parts")


def _prompts(prompt: Any) -> list[str]:
    if isinstance(prompt, str):
        return [bounds.prompt(prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) > MAX_CHOICES:
            raise bad("prompt", f"{len(prompt)} prompts; at most {MAX_CHOICES}")
        return [bounds.prompt(p) for p in prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        raise bad("prompt", "token-id prompts are not supported; send the text")
    raise bad("prompt", "must be a string or a non-empty list of strings")


def _include_usage(body: dict, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise bad("stream_options", "must be an object such as {\"include_usage\": true}")
    if not stream:
        raise bad("stream_options", "is only allowed with stream: true")
    return bool(_bool(options, "include_usage", "stream_options.include_usage"))


def _timeout(body: dict) -> float | None:
    """``timeout`` (an ovpool extension): seconds before the request fails with 504."""
    value = body.get("timeout")
    if value is None:
        return None
    if bounds.number(value, "timeout", 0.0, float("inf")) == 0:
        raise bad("timeout", "must be > 0 seconds")
    return float(value)


def body_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return body


def _int(body: dict, name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    return None if value is None else bounds.integer(value, name, low, high)


def _bool(body: dict, name: str, param: str | None = None) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise bad(param or name, f"must be true or false, got {bounds.describe(value)}")
    return value
