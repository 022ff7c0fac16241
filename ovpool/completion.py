"""What a generation returns, shared by the engine, the worker, the broker's replies and the client.

The ``from_*`` readers take a worker's output off the wire (the broker forwards it unchanged), so
they trust no part of it: each known field is checked for its exact type and shape (a bool is not
an int), fields a newer peer added are ignored at every depth, and anything else raises
MalformedMessageError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ovpool.errors import MalformedMessageError
from ovpool.tools import ToolCall, ToolCallDelta

_REQUIRED = object()
_NUMBER = (float, int)
_INT = {int}


def _take(d: dict, key: str, types: tuple[type, ...], where: str, default: Any = _REQUIRED) -> Any:
    """``d[key]`` if its type is exactly one of ``types``; ``default`` when absent or None."""
    value = d.get(key)
    if type(value) in types:
        return value
    if value is None and default is not _REQUIRED:
        return default
    if key not in d:
        raise MalformedMessageError(f"{where}.{key} is missing")
    if type(value) not in types:
        raise MalformedMessageError(f"{where}.{key} must be {' or '.join(t.__name__ for t in types)},"
                                    f" got {type(value).__name__}")
    return value


def _ints(values: Any, where: str) -> list[int]:
    if type(values) is not list or not set(map(type, values)) <= _INT:  # a bool is no int here
        raise MalformedMessageError(f"{where} must be a list of ints")
    return values


def _logprob(w: Any, where: str) -> Logprob:
    """A ``[id, text, logprob, ...]`` entry (a newer peer's extra items ignored)."""
    if type(w) is not list or len(w) < 3 or type(w[0]) is not int or type(w[1]) is not str \
            or type(w[2]) not in _NUMBER:
        raise MalformedMessageError(f"{where} must be [token id, text, logprob]")
    return Logprob(w[0], w[1], float(w[2]))


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability: its id, its own text (special tokens as written; bytes of an
    incomplete UTF-8 sequence as U+FFFD) and the natural log of its probability."""

    token_id: int
    text: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprobs:
    """An output token's Logprob (``chosen``) and the ``top`` most probable at its position, most
    probable first (what SamplingParams.logprobs asks for; its docstring says of which logits)."""

    chosen: Logprob
    top: tuple[Logprob, ...] = ()

    def to_wire(self) -> list:
        """Compact for msgpack and JSON: [id, text, logprob, [[id, text, logprob], ...]]."""
        c = self.chosen
        return [c.token_id, c.text, c.logprob, [[t.token_id, t.text, t.logprob] for t in self.top]]

    @classmethod
    def from_wire(cls, w: Any, where: str = "logprobs") -> TokenLogprobs:
        """The inverse of ``to_wire``, from an untrusted peer (module docstring)."""
        if type(w) is not list or len(w) < 4 or type(w[3]) is not list:
            raise MalformedMessageError(f"{where} must be [token id, text, logprob, [top...]]")
        return cls(_logprob(w, where), tuple(_logprob(t, f"{where}.top[{i}]") for i, t in enumerate(w[3])))

    @classmethod
    def list_from_wire(cls, ws: Any, where: str = "logprobs") -> tuple[TokenLogprobs, ...]:
        """A PARTIAL's or FINAL's ``logprobs`` list."""
        if ws == []:  # most PARTIALs: no log-probabilities asked for
            return ()
        if type(ws) is not list:
            raise MalformedMessageError(f"{where} must be a list")
        return tuple(cls.from_wire(w, f"{where}[{i}]") for i, w in enumerate(ws))


@dataclass(frozen=True)
class Delta:
    """Generated text as it streams: the index in the completion of its last token, that token's
    id and the new text; ``logprobs``, when asked for, of every token since the previous Delta
    (a token whose text is held back, an incomplete character or a possible stop string, comes
    with the next one). With tools, ``text`` is the reply's text outside its calls and
    ``tool_calls`` the pieces of calls since the previous Delta (ovpool.tools.ToolCallDelta)."""

    index: int
    token_id: int
    text: str
    logprobs: tuple[TokenLogprobs, ...] = ()
    tool_calls: tuple[ToolCallDelta, ...] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    # Of the prompt tokens, those taken from the prefix cache (the worker's pool or the KV tier).
    # Not compared: the same request gives the same usage whether its prefix was cached or not.
    cached_prompt_tokens: int = field(default=0, compare=False)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_dict(cls, d: Any, where: str = "usage") -> Usage:
        if type(d) is not dict:
            raise MalformedMessageError(f"{where} must be a map")
        return cls(_take(d, "prompt_tokens", (int,), where), _take(d, "completion_tokens", (int,), where),
                   _take(d, "cached_prompt_tokens", (int,), where, 0))


@dataclass(frozen=True)
class Completion:
    """A finished generation. ``finish_reason`` is ``stop`` (EOS or stop string), ``length`` or
    ``tool_calls`` (the reply ended with the ``tool_calls`` it made; ``text`` is its text outside
    them, often ""); ``note`` says what the reason alone does not, for a user to read (e.g.
    ``length`` because the model's context filled before max_tokens), else "". A reply cut at
    ``length`` inside a call lists only its complete calls; ``stop`` is the stop string that
    ended it, if one did."""

    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    # Seconds: ttft_s (time to first token), total_s, and decode_tps (tokens/s after the first).
    timings: dict[str, float] = field(default_factory=dict)
    # One per token of token_ids when SamplingParams.logprobs asked for them, else None.
    logprobs: list[TokenLogprobs] | None = None
    note: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    stop: str | None = None  # the stop string that ended it (finish_reason "stop"), else None

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON and msgpack safe); ``logprobs`` in TokenLogprobs' wire form."""
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
                "usage": {"prompt_tokens": self.usage.prompt_tokens,
                          "completion_tokens": self.usage.completion_tokens,
                          "cached_prompt_tokens": self.usage.cached_prompt_tokens},
                "timings": self.timings,
                "logprobs": None if self.logprobs is None else [t.to_wire() for t in self.logprobs],
                "note": self.note, "tool_calls": [c.to_dict() for c in self.tool_calls], "stop": self.stop}

    @classmethod
    def from_dict(cls, d: Any, where: str = "completion") -> Completion:
        """The inverse of ``to_dict``, from an untrusted peer (module docstring); a timing that is
        not a number is dropped (``timings`` is open to what a newer worker measures)."""
        if type(d) is not dict:
            raise MalformedMessageError(f"{where} must be a map")
        logprobs = d.get("logprobs")
        timings = _take(d, "timings", (dict,), where, {})
        calls = _take(d, "tool_calls", (list,), where, [])
        return cls(text=_take(d, "text", (str,), where),
                   token_ids=_ints(d.get("token_ids"), f"{where}.token_ids"),
                   finish_reason=_take(d, "finish_reason", (str,), where),
                   usage=Usage.from_dict(d.get("usage"), f"{where}.usage"),
                   timings={k: float(v) for k, v in timings.items()
                            if type(k) is str and type(v) in _NUMBER},
                   logprobs=None if logprobs is None
                   else list(TokenLogprobs.list_from_wire(logprobs, f"{where}.logprobs")),
                   note=_take(d, "note", (str,), where, ""),
                   tool_calls=[ToolCall.from_dict(c, f"{where}.tool_calls[{i}]")
                               for i, c in enumerate(calls)],
                   stop=_take(d, "stop", (str,), where, None))
