"""What a generation returns, shared by the engine, the worker, the broker's replies and the client."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Delta:
    """One generated token as it streams: its index in the completion, id and new text."""

    index: int
    token_id: int
    text: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Completion:
    """A finished generation. ``finish_reason`` is ``stop`` (EOS or stop string) or ``length``."""

    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    # Seconds: ttft_s (time to first token), total_s, and decode_tps (tokens/s after the first).
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Completion:
        return cls(text=d["text"], token_ids=list(d["token_ids"]), finish_reason=d["finish_reason"],
                   usage=Usage(**d["usage"]), timings=dict(d.get("timings") or {}))
