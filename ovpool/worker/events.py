"""What a worker backend's ``step()`` reports per request: a token, a finished completion, a failure."""

from __future__ import annotations

from dataclasses import dataclass

from ovpool.completion import Completion, Delta
from ovpool.errors import OvpoolError


@dataclass(frozen=True)
class Token:
    request_id: str
    delta: Delta


@dataclass(frozen=True)
class Finished:
    request_id: str
    completion: Completion


@dataclass(frozen=True)
class Failed:
    request_id: str
    error: OvpoolError


Event = Token | Finished | Failed
