"""What a request's values may be: the one definition of each bound, shared by the HTTP schema
(ovpool.api.schema), SamplingParams (and so every wire decoder of sampling parameters), the client's
SUBMIT (ovpool.submit.make_submit) and the broker's admission.

A value inside these bounds is representable on the wire (msgpack: ints within 64 bits, strings
UTF-8) and cheap enough to admit; anything else is an InvalidRequestError naming its field. The
checks are O(1) for the common case (ASCII strings, small maps), so the hot path does not pay them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from ovpool.errors import InvalidRequestError

INT_MIN, INT_MAX = -(2**63), 2**64 - 1  # what msgpack encodes: int64 and uint64
# The least int a response_format may hold: llguidance 1.9 segfaults on an enum or const within
# 512 of -2**63 (the whole process, whichever compiles it: the API, the broker, a worker).
FORMAT_INT_MIN = INT_MIN + 1024
MAX_TOKENS = 2**31 - 1   # max_tokens (a pool's max_new_tokens lowers it further)
MAX_TOP_K = 2**31 - 1    # top_k: more than any vocabulary
MAX_TOKEN_ID = 2**31 - 1  # logit_bias ids: 10 decimal digits at most
SEED_RANGE = 2**63       # seeds are in [0, 2**63)
MAX_TEMPERATURE = 2.0    # OpenAI's range: [0, 2]
MAX_PENALTY = 2.0        # |presence_penalty|, |frequency_penalty|: OpenAI's and vLLM's range
MAX_LOGPROBS = 20        # top alternatives per token, as OpenAI's top_logprobs allows
MAX_LOGIT_BIAS = 100.0   # |bias| at most, OpenAI's range
MAX_LOGIT_BIAS_ENTRIES = 300  # OpenAI's cap on logit_bias entries
MAX_STOP = 16            # stop strings (OpenAI takes 4)
MAX_STOP_CHARS = 1024    # characters per stop string
MAX_NAME_CHARS = 256     # a model name, a chat message's role or name (as broker/bounds.py)
MAX_CHOICES = 128        # n × prompts of one HTTP request: one broker request each
MAX_MESSAGES = 4096      # chat messages per request
MAX_SLOTS = 1024         # a worker's slots: the setting's maximum, what the broker fills at most
# Characters of one prompt (a chat's: every message's content together). 8 characters a token for
# a 131,072-token context; tokenizing this many takes ~0.6 s (SmolLM2's BPE, AVX2 host).
MAX_PROMPT_CHARS = 2**20
# Tokens one HTTP request may ask for in all (n × prompts × max_tokens), and log-probability
# entries (× (logprobs + 1)): ~64 MB of JSON at the latter, the size of the largest message.
MAX_REQUEST_TOKENS = 2**18
MAX_LOGPROB_ENTRIES = 2**21
MAX_JSON_DEPTH = 64      # nesting of a request body (and of a response_format in it)
# A response_format's size: one unit per value plus each string's characters (~ its JSON bytes).
MAX_FORMAT_SIZE = 2**20


def integer(value: Any, param: str, low: int, high: int) -> int:
    """``value`` if it is an int (not a bool) in [low, high], else a 400 naming ``param``."""
    if type(value) is not int or not low <= value <= high:
        raise InvalidRequestError(f"{param}: must be an integer in [{low}, {high}], got "
                                  f"{describe(value)}", param=param)
    return value


def number(value: Any, param: str, low: float, high: float) -> float:
    """``value`` as a float if it is a finite int or float in [low, high], else a 400."""
    if type(value) not in (int, float) or not low <= value <= high or not math.isfinite(value):
        raise InvalidRequestError(f"{param}: must be a number in [{low:g}, {high:g}], got "
                                  f"{describe(value)}", param=param)
    return float(value)


def is_text(value: Any) -> bool:
    """A str that UTF-8 can encode: ASCII is known in O(1); only other text is encoded to see
    (json.loads accepts a lone surrogate such as "\\ud800", which no wire can carry)."""
    if type(value) is not str:
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def text(value: Any, param: str, max_chars: int = MAX_PROMPT_CHARS) -> str:
    """``value`` if it is a str UTF-8 can encode of at most ``max_chars``, else a 400 (the length
    first: it costs nothing, encoding a long text does)."""
    if type(value) is not str:
        raise InvalidRequestError(f"{param}: must be a string, got {type(value).__name__}", param=param)
    if len(value) > max_chars:
        raise InvalidRequestError(f"{param}: {len(value):,} characters, more than {max_chars:,}",
                                  param=param)
    if not is_text(value):
        raise InvalidRequestError(f"{param}: a lone surrogate cannot be encoded as UTF-8", param=param)
    return value


def prompt(value: Any, param: str = "prompt") -> str:
    """A text prompt within MAX_PROMPT_CHARS."""
    return text(value, param)


def messages(value: Any, param: str = "messages") -> list:
    """Chat messages: at most MAX_MESSAGES maps with a string ``role`` and ``content`` (and
    ``name``, if given), their contents within MAX_PROMPT_CHARS together; any other field (it
    reaches the chat template) a JSON value (``json_value``)."""
    if type(value) is not list or not value or len(value) > MAX_MESSAGES:
        raise InvalidRequestError(f'{param}: must be a list of 1 to {MAX_MESSAGES} {{"role": ..., '
                                  '"content": ...}} maps', param=param)
    total = 0
    for i, message in enumerate(value):
        if type(message) is not dict:
            raise InvalidRequestError(f"{param}[{i}]: must be a map with role and content",
                                      param=f"{param}[{i}]")
        text(message.get("role"), f"{param}[{i}].role", MAX_NAME_CHARS)
        calls = _tool_calls(message, f"{param}[{i}]")  # checked whether or not there is content
        if message.get("content") is not None or not calls:
            total += len(text(message.get("content"), f"{param}[{i}].content"))
        if "name" in message:
            text(message["name"], f"{param}[{i}].name", MAX_NAME_CHARS)
        if len(message) > 2 + ("name" in message):
            json_value(message, f"{param}[{i}]")
    if total > MAX_PROMPT_CHARS:
        raise InvalidRequestError(f"{param}: {total:,} characters of content, more than "
                                  f"{MAX_PROMPT_CHARS:,}", param=param)
    return value


def _tool_calls(message: dict, param: str) -> bool:
    """Whether ``message`` is an assistant's with OpenAI's ``tool_calls`` (its content may then be
    null): a non-empty list of {"id", "type": "function", "function": {"name", "arguments"}}."""
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or calls is None:
        return False
    if type(calls) is not list or not calls or not all(
            type(c) is dict and type(c.get("function")) is dict and is_text(c["function"].get("name"))
            and is_text(c["function"].get("arguments")) for c in calls):
        raise InvalidRequestError(f'{param}.tool_calls: must be a list of {{"id": ..., "type": "function", '
                                  '"function": {"name": ..., "arguments": "<JSON text>"}}', param=param)
    for j, c in enumerate(calls):
        _arguments(c["function"]["arguments"], f"{param}.tool_calls[{j}].function.arguments")
    return True


def _arguments(text: str, param: str) -> None:
    """A history call's arguments that are JSON must come out of the worker's template again: it
    parses them and writes them with ``tojson``, where an escaped lone surrogate becomes one that
    UTF-8 cannot encode, and nesting past the parser's recursion fails."""
    try:
        json.dumps(json.loads(text), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # a ValueError too: first
        raise InvalidRequestError(f"{param}: holds an escaped lone surrogate, which UTF-8 cannot encode",
                                  param=param) from None
    except ValueError:
        return  # not JSON: the template gets the text as it is
    except RecursionError:
        raise InvalidRequestError(f"{param}: nested too deeply", param=param) from None


def request_tokens(choices: int, max_tokens: int, param: str = "max_tokens") -> None:
    """Refuse an HTTP request whose ``choices`` × ``max_tokens`` is over MAX_REQUEST_TOKENS."""
    if choices * max_tokens > MAX_REQUEST_TOKENS:
        raise InvalidRequestError(f"{param}: {choices} choice(s) × max_tokens {max_tokens} = "
                                  f"{choices * max_tokens:,} tokens, more than {MAX_REQUEST_TOKENS:,}; "
                                  "lower n or max_tokens", param=param)


def logprob_entries(choices: int, max_tokens: int, logprobs: int | None) -> None:
    """Refuse ``choices`` × ``max_tokens`` × (``logprobs`` + 1) over MAX_LOGPROB_ENTRIES."""
    entries = choices * max_tokens * (logprobs + 1) if logprobs is not None else 0
    if entries > MAX_LOGPROB_ENTRIES:
        raise InvalidRequestError(
            f"logprobs: {choices} choice(s) × max_tokens {max_tokens} × (logprobs {logprobs} + 1) = "
            f"{entries:,} log-probabilities, more than {MAX_LOGPROB_ENTRIES:,}; lower one of them",
            param="logprobs")


def json_value(value: Any, param: str, max_size: int = MAX_FORMAT_SIZE) -> None:
    """Refuse ``value`` unless it is JSON the wire carries: maps with string keys, lists, strings
    UTF-8 encodes, finite floats, ints within 64 bits, bools, None; at most MAX_JSON_DEPTH deep
    and ``max_size`` big (one per value plus each string's characters). Iterative, never recursive."""
    size = 0
    for item, level in _walk(value):
        if level > MAX_JSON_DEPTH:
            raise InvalidRequestError(f"{param}: nested more than {MAX_JSON_DEPTH} levels deep", param=param)
        if type(item) is dict:
            if not all(map(is_text, item)):
                raise InvalidRequestError(f"{param}: map keys must be UTF-8 strings", param=param)
            size += sum(map(len, item))
        elif not _scalar_ok(item):
            raise InvalidRequestError(f"{param}: holds {describe(item)}, which is not representable "
                                      "(JSON values only: ints in [-2**63 + 1024, 2**64), finite "
                                      "numbers, UTF-8 strings)", param=param)
        size += 1 + (len(item) if type(item) is str else 0)
        if size > max_size:
            raise InvalidRequestError(f"{param}: larger than {max_size:,} (values plus characters)",
                                      param=param)


def depth(body: Any) -> None:
    """Refuse a request body nested more than MAX_JSON_DEPTH levels, naming its top-level field."""
    for key, value in body.items() if type(body) is dict else [(None, body)]:
        if any(level + (key is not None) > MAX_JSON_DEPTH for _, level in _walk(value)):
            raise InvalidRequestError(f"{key or 'the request body'}: nested more than {MAX_JSON_DEPTH}"
                                      " levels deep", param=key)


def _walk(value: Any) -> Iterator[tuple[Any, int]]:
    """Every value under ``value`` (containers too) with its depth (``value``: 1), breadth first:
    no recursion, whatever the depth."""
    level, depth = [value], 1
    while level:
        below: list = []
        for item in level:
            if type(item) is dict:
                below.extend(item.values())
            elif type(item) in (list, tuple):
                below.extend(item)
            yield item, depth
        level, depth = below, depth + 1


def _scalar_ok(item: Any) -> bool:
    kind = type(item)
    if kind is int:
        return FORMAT_INT_MIN <= item <= INT_MAX
    if kind is float:
        return math.isfinite(item)
    if kind is str:
        return is_text(item)
    return kind in (dict, list, tuple, bool, type(None))


def describe(value: Any) -> str:
    """A bounded description of a client's value: never a deep repr, never a 5,000-digit int."""
    if type(value) is int and not INT_MIN <= value <= INT_MAX:
        return f"an integer of {value.bit_length()} bits"
    if type(value) in (int, float, bool, type(None)):
        return repr(value)
    if type(value) is str and not is_text(value):
        return "a string UTF-8 cannot encode"
    if type(value) is str:
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    return f"a {type(value).__name__}"
