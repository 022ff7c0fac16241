"""OpenAI request bodies as ovpool requests: every field checked once, with the field's name.

Pure functions on parsed JSON. Unknown fields are ignored, as OpenAI's API does; a known field
with a bad value raises InvalidRequestError naming it (``param``), which the app answers with 400.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ovpool import response_format as formats
from ovpool.errors import InvalidRequestError
from ovpool.sampling_params import MAX_LOGPROBS

# OpenAI's default for /v1/completions; chat defaults to the server's max_new_tokens.
COMPLETION_MAX_TOKENS = 16
MAX_CHOICES = 128  # n × prompts: one broker request each
_SEED_RANGE = 2**63  # SamplingParams seeds are in [0, 2**63)
# Fields that map 1:1 onto a SamplingParams field of the same name, with their ranges (OpenAI's
# for the penalties; vLLM's for min_p and repetition_penalty).
_NUMBERS = {"temperature": (0.0, None), "top_p": (0.0, 1.0), "min_p": (0.0, 1.0),
            "presence_penalty": (-2.0, 2.0), "frequency_penalty": (-2.0, 2.0),
            "repetition_penalty": (0.0, None)}
_ABOVE_ZERO = ("top_p", "repetition_penalty")  # 0 is in range above, but not allowed


@dataclass(frozen=True)
class Choice:
    """One generation to run: its index in the response, its prompt (text or chat messages) and
    SamplingParams keyword arguments."""

    index: int
    prompt: str | list[dict[str, str]]
    sampling: dict[str, Any]


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


def bad(param: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {why}", param=param)


def parse_chat(body: Any, max_tokens: int) -> Generate:
    """A /v1/chat/completions body; ``max_tokens`` is the default when the body gives none."""
    body = _object(body)
    messages = chat_messages(body.get("messages"))
    _no_tools(body)
    tokens = _int(body, "max_completion_tokens", 1) or _int(body, "max_tokens", 1) or max_tokens
    top = _int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if not _bool(body, "logprobs"):
        if top is not None:
            raise bad("top_logprobs", "needs logprobs: true")
        return _generate(body, True, [messages], tokens, None, echo=False)
    return _generate(body, True, [messages], tokens, top or 0, echo=False)


def parse_completion(body: Any) -> Generate:
    """A /v1/completions body."""
    body = _object(body)
    tokens = _int(body, "max_tokens", 1) or COMPLETION_MAX_TOKENS
    echo = bool(_bool(body, "echo"))
    logprobs = _int(body, "logprobs", 0, MAX_LOGPROBS)
    if echo and logprobs is not None:
        raise bad("echo", "echo with logprobs (log-probabilities of the prompt) is not supported")
    return _generate(body, False, _prompts(body.get("prompt")), tokens, logprobs, echo)


def _generate(body: dict, chat: bool, prompts: list, max_tokens: int, logprobs: int | None,
              echo: bool) -> Generate:
    model = body.get("model")
    if not isinstance(model, str):
        raise bad("model", "must be a string naming a served model (GET /v1/models lists them)")
    n = _int(body, "n", 1, MAX_CHOICES) or 1
    if n * len(prompts) > MAX_CHOICES:
        raise bad("n", f"n × prompts = {n * len(prompts)} choices; at most {MAX_CHOICES}")
    stream = bool(_bool(body, "stream"))
    base = {"max_tokens": max_tokens, **_sampling(body)}
    fmt = _response_format(body.get("response_format"))
    if fmt is not None:
        base["response_format"] = fmt
    if logprobs is not None:
        base["logprobs"] = logprobs
    seed = base.pop("seed", None)
    choices = [Choice(i * n + j, prompt, {**base, "seed": None if seed is None else (seed + j) % _SEED_RANGE})
               for i, prompt in enumerate(prompts) for j in range(n)]
    return Generate(chat, model, choices, n, stream, _include_usage(body, stream), echo, logprobs,
                    _timeout(body))


def _sampling(body: dict) -> dict[str, Any]:
    """SamplingParams keyword arguments from the body's sampling fields (OpenAI's defaults)."""
    out: dict[str, Any] = {"temperature": 1.0}  # OpenAI samples unless told otherwise
    for name, (low, high) in _NUMBERS.items():
        value = _number(body, name, low, high)
        if value is not None:
            out[name] = value
    for name in _ABOVE_ZERO:
        if out.get(name) == 0:
            raise bad(name, "must be > 0")
    top_k = _int(body, "top_k", -1)
    if top_k is not None:
        out["top_k"] = max(top_k, 0)  # vLLM's -1 and 0 both mean no top-k filter
    seed = _int(body, "seed")
    if seed is not None:
        if not -_SEED_RANGE <= seed < _SEED_RANGE:
            raise bad("seed", f"must be in [-2**63, 2**63), got {seed}")
        out["seed"] = seed % _SEED_RANGE
    stop = _stop(body.get("stop"))
    if stop:
        out["stop"] = stop
    if _bool(body, "ignore_eos"):
        out["ignore_eos"] = True
    bias = _logit_bias(body.get("logit_bias"))
    if bias:
        out["logit_bias"] = bias
    return out


def chat_messages(messages: Any) -> list[dict[str, str]]:
    """OpenAI chat messages as {role, content} strings (text parts joined; other parts refused)."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "must be a non-empty list of {\"role\": ..., \"content\": ...}")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad(f"messages[{i}]", "must be an object with a string role")
        out.append({"role": message["role"], "content": _content(message.get("content"), i)})
    return out


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
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        raise bad("prompt", "token-id prompts are not supported; send the text")
    raise bad("prompt", "must be a string or a non-empty list of strings")


def _stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise bad("stop", "must be a non-empty string or a list of them")
    return list(items)


def _logit_bias(bias: Any) -> dict[int, float]:
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise bad("logit_bias", "must map token ids to numbers in [-100, 100]")
    out = {}
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isdigit()) or not _is_number(value) or not -100 <= value <= 100:
            raise bad("logit_bias", f"{key!r}: {value!r}: must map token ids to numbers in [-100, 100]")
        out[int(key)] = float(value)
    return out


def _response_format(fmt: Any) -> dict[str, Any] | None:
    """OpenAI's shapes (text, json_object, json_schema) and ovpool's (regex, grammar), in their
    canonical form (docs/structured-output.md); a malformed one is a 400 naming the field."""
    try:
        return formats.normalize(fmt)
    except InvalidRequestError as exc:
        raise InvalidRequestError(str(exc), param="response_format") from exc


def _no_tools(body: dict) -> None:
    if body.get("tools"):
        raise bad("tools", "tool calling is not supported; send messages only")


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
    value = _number(body, "timeout", 0.0, None)
    if value == 0:
        raise bad("timeout", "must be > 0 seconds")
    return value


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return body


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _number(body: dict, name: str, low: float | None, high: float | None) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_number(value) or (low is not None and value < low) or (high is not None and value > high):
        span = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise bad(name, f"must be a number {span}, got {value!r}")
    return float(value)


def _int(body: dict, name: str, low: int | None = None, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int or (low is not None and value < low) or (high is not None and value > high):
        span = f" in [{low}, {high}]" if high is not None else (f" >= {low}" if low is not None else "")
        raise bad(name, f"must be an integer{span}, got {value!r}")
    return value


def _bool(body: dict, name: str, param: str | None = None) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise bad(param or name, f"must be true or false, got {value!r}")
    return value
