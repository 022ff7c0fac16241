"""The vocabulary of residency (ovpool.broker.residency): a model's policy (keep-alive, pin, devices),
its state, the actions residency's decisions take, and the record it keeps of each model. Apart
from the decisions, so serve, the catalog and the tests speak it without the decision logic."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

NEVER = -1.0  # a keep-alive that never expires
MIB = 1 << 20

Usage = Mapping[str, int]  # requests queued (or in flight) per model


class ModelState(str, Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    FAILED = "failed"


RESIDENT = (ModelState.LOADING, ModelState.LOADED, ModelState.UNLOADING)


@dataclass(frozen=True)
class ModelPolicy:
    """One model of the catalog: ``keep_alive_s`` idle seconds before it unloads (NEVER: -1),
    ``devices`` its workers run on (each device has its own byte budget)."""

    name: str
    keep_alive_s: float = 300.0
    pinned: bool = False
    devices: tuple[str, ...] = ("CPU",)


@dataclass(frozen=True)
class Load:
    model: str


@dataclass(frozen=True)
class Unload:
    model: str
    reason: str


@dataclass(frozen=True)
class Notice:
    """Once per load: ``model`` is over the byte budget on its own, which no unload can fix."""

    model: str
    text: str


Action = Load | Unload | Notice


@dataclass
class Resident:
    """What residency keeps of one model: its policy, state, use, orders, counts and memory."""

    policy: ModelPolicy
    state: ModelState = ModelState.UNLOADED
    last_used: float = 0.0
    wanted_since: float | None = None  # requests wait for it while it is not loaded
    ordered: str = ""  # "load" or "unload", asked for (POST /v1/models/{id}/load|unload)
    loads: int = 0
    unloads: int = 0
    reason: str = ""
    keep_alive_s: float | None = None  # its latest request's keep-alive; None: the policy's
    memory: dict[str, int] = field(default_factory=dict)  # device -> bytes its workers hold now
    known: dict[str, int] = field(default_factory=dict)  # device -> bytes it held when last loaded
    noticed: bool = False  # its Notice went out for this load
    leaving: bool = False  # unloading, its workers told to exit: out of the count budget (on CPU)

    @property
    def keep(self) -> float:
        return self.policy.keep_alive_s if self.keep_alive_s is None else self.keep_alive_s

    def size(self, device: str) -> int:
        """Its bytes on ``device``: measured, or for a load under way what it took last time."""
        now = self.memory.get(device, 0)
        return max(now, self.known.get(device, 0)) if self.state is ModelState.LOADING else now
