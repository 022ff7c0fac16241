"""What a generation returns, shared by the engine, the worker, the broker's replies and the client."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    def from_wire(cls, w: list) -> TokenLogprobs:
        return cls(Logprob(w[0], w[1], w[2]), tuple(Logprob(*t) for t in w[3]))


@dataclass(frozen=True)
class Delta:
    """Generated text as it streams: the index in the completion of its last token, that token's
    id and the new text; ``logprobs``, when asked for, of every token since the previous Delta
    (a token whose text is held back, an incomplete character or a possible stop string, comes
    with the next one)."""

    index: int
    token_id: int
    text: str
    logprobs: tuple[TokenLogprobs, ...] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Completion:
    """A finished generation. ``finish_reason`` is ``stop`` (EOS or stop string) or ``length``;
    ``note`` says what the reason alone does not, for a user to read (e.g. ``length`` because the
    model's context filled before max_tokens), else ""."""

    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    # Seconds: ttft_s (time to first token), total_s, and decode_tps (tokens/s after the first).
    timings: dict[str, float] = field(default_factory=dict)
    # One per token of token_ids when SamplingParams.logprobs asked for them, else None.
    logprobs: list[TokenLogprobs] | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON and msgpack safe); ``logprobs`` in TokenLogprobs' wire form."""
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
                "usage": {"prompt_tokens": self.usage.prompt_tokens,
                          "completion_tokens": self.usage.completion_tokens},
                "timings": self.timings,
                "logprobs": None if self.logprobs is None else [t.to_wire() for t in self.logprobs],
                "note": self.note}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Completion:
        logprobs = d.get("logprobs")
        return cls(text=d["text"], token_ids=list(d["token_ids"]), finish_reason=d["finish_reason"],
                   usage=Usage(**d["usage"]), timings=dict(d.get("timings") or {}),
                   logprobs=None if logprobs is None else [TokenLogprobs.from_wire(t) for t in logprobs],
                   note=d.get("note") or "")
