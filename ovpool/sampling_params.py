"""Sampling parameters as they travel on the wire: plain data, validated, no NumPy (the client and
the protocol import this; the worker's sampler reads it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ovpool.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` is greedy; the same seed gives the same tokens."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0          # 0: no top-k filter
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        checks = [
            (self.max_tokens >= 1, "max_tokens must be at least 1"),
            (self.temperature >= 0, "temperature must be >= 0 (0 means greedy)"),
            (self.top_k >= 0, "top_k must be >= 0 (0 disables it)"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (all(isinstance(s, str) and s for s in self.stop), "stop must be non-empty strings"),
        ]
        for ok, why in checks:
            if not ok:
                raise InvalidRequestError(f"sampling: {why}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        known = cls.__dataclass_fields__
        unknown = set(d) - set(known)
        if unknown:
            raise InvalidRequestError(
                f"sampling: unknown parameter(s) {sorted(unknown)}; valid: {sorted(known)}")
        try:
            return cls(**d)
        except TypeError as exc:
            raise InvalidRequestError(f"sampling: {exc}") from exc
