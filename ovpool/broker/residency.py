"""Which models of a pool are loaded, as pure logic: observations in, Load/Unload actions out.

A pool serves a catalog of models, not all of them loaded at once. ``Residency`` decides, for the
models of one ``ovpool serve`` (one host's devices), which to load and which to unload:

- a model with requests queued and none of its workers up is loaded (one Load however many
  requests wait: concurrent first requests for a cold model cause one load);
- at most ``max_loaded`` models are resident (loading, loaded or unloading) at any moment; when a
  load would pass it, the least recently used loaded model that is neither pinned nor busy
  (requests in flight or queued) is unloaded first, and the load follows once it has gone;
- a loaded model idle for its keep-alive (seconds; -1 never) is unloaded; pinned models never are;
- a model whose load failed stays ``failed`` (the broker fails its requests naming why: the
  worker's LOAD_FAILED, or the supervisor's report of a worker failing for good).

Nothing here touches a process or a socket, and time is passed in, so the property tests drive
hours of traffic in microseconds (tests/test_broker_residency.py). Its actions are carried out by
``ovpool.serve.pool``, which starts and stops one worker process per model and device.

Why processes per model, not a worker swapping its model on a broker command: an unload then gives
the memory back whole (the process exits; what a swapped-out OpenVINO model leaves in the
allocator's arenas stays in a long-lived worker's RSS, and the budget is about real memory), a bad
model file costs only its own process, and the supervisor's crash and give-up policy applies per
model unchanged. It costs the interpreter and OpenVINO's import on each load (figures in
docs/operations.md, "Many models"), which the cache's prefetch overlaps with the import of the
compiled blob, so a warm load stays an import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from ovpool.errors import ConfigError

NEVER = -1.0  # a keep-alive that never expires


class ModelState(str, Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    FAILED = "failed"


RESIDENT = (ModelState.LOADING, ModelState.LOADED, ModelState.UNLOADING)


@dataclass(frozen=True)
class ModelPolicy:
    """One model of the catalog: ``keep_alive_s`` idle seconds before it unloads (NEVER: -1)."""

    name: str
    keep_alive_s: float = 300.0
    pinned: bool = False


@dataclass(frozen=True)
class Load:
    model: str


@dataclass(frozen=True)
class Unload:
    model: str
    reason: str


Action = Load | Unload


@dataclass
class _Model:
    policy: ModelPolicy
    state: ModelState = ModelState.UNLOADED
    last_used: float = 0.0
    wanted_since: float | None = None  # requests wait for it while it is not loaded
    ordered: str = ""  # "load" or "unload", asked for (POST /v1/models/{id}/load|unload)
    loads: int = 0
    unloads: int = 0
    reason: str = ""


class Residency:
    """``max_loaded`` None: no budget. Pinned models are loaded at the first ``observe``; pins that
    leave no room for the other models are a ConfigError."""

    def __init__(self, models: list[ModelPolicy], max_loaded: int | None = None):
        pinned = [m.name for m in models if m.pinned]
        if max_loaded is not None and pinned and len(pinned) >= max_loaded and len(models) > max_loaded:
            raise ConfigError(f"the pinned models ({', '.join(pinned)}) take the whole budget of "
                              f"max_loaded={max_loaded}, so the others could never load; pin fewer "
                              "or raise --max-loaded")
        self.max_loaded = max_loaded
        self._models = {m.name: _Model(m) for m in models}

    # -- events ---------------------------------------------------------------------------------

    def observe(self, now: float, queued: Mapping[str, int], active: Mapping[str, int]) -> list[Action]:
        """The broker's view at ``now`` (requests queued and in flight per model): the actions due."""
        for name, m in self._models.items():
            if queued.get(name, 0) or active.get(name, 0):
                m.last_used = now
                if m.wanted_since is None and m.state not in (ModelState.LOADED, ModelState.FAILED):
                    m.wanted_since = now
            elif m.state is not ModelState.LOADING and m.ordered != "load":
                m.wanted_since = None
        out: list[Action] = []
        self._expire(now, queued, active, out)
        self._load_wanted(now, queued, active, out)
        return out

    def order(self, model: str, action: str, now: float) -> None:
        """Load ``model`` (as if a request waited for it) or unload it once idle (not a pinned one)."""
        m = self._models[model]
        if action == "load" and m.state is not ModelState.FAILED:
            m.ordered, m.last_used = "load", now
            if m.state is not ModelState.LOADED:
                m.wanted_since = m.wanted_since if m.wanted_since is not None else now
        elif action == "unload" and not m.policy.pinned:
            m.ordered, m.wanted_since = "unload", None

    def loaded(self, model: str, now: float) -> None:
        """A worker of ``model`` registered with the broker."""
        m = self._models[model]
        if m.state is ModelState.LOADING:
            m.state, m.last_used, m.wanted_since, m.reason = ModelState.LOADED, now, None, ""
            m.ordered = "" if m.ordered == "load" else m.ordered

    def restarting(self, model: str) -> None:
        """A worker of a loaded ``model`` exited on its own; the supervisor starts it again."""
        m = self._models[model]
        if m.state is ModelState.LOADED:
            m.state = ModelState.LOADING

    def unloaded(self, model: str) -> None:
        """The workers of ``model`` that an Unload stopped have exited."""
        m = self._models[model]
        if m.state is ModelState.UNLOADING:
            m.state = ModelState.UNLOADED

    def gone(self, model: str) -> None:
        """The workers of ``model`` were stopped by someone else (a drain): it is not loaded."""
        m = self._models[model]
        if m.state in RESIDENT:
            m.state, m.reason = ModelState.UNLOADED, "its workers were drained"

    def failed(self, model: str, reason: str) -> None:
        """``model`` cannot load (a bad file, a worker the supervisor gave up on): for good."""
        m = self._models[model]
        m.state, m.reason, m.wanted_since = ModelState.FAILED, reason, None

    # -- views ----------------------------------------------------------------------------------

    def state(self, model: str) -> ModelState:
        return self._models[model].state

    def resident(self) -> int:
        return sum(m.state in RESIDENT for m in self._models.values())

    def describe(self, model: str, now: float) -> dict:
        """One model as serve reports it (flat: the broker keeps maps of text and numbers)."""
        m = self._models[model]
        waiting = round(now - m.wanted_since, 3) if m.wanted_since is not None else 0.0
        return {"model": model, "residency": m.state.value, "pinned": int(m.policy.pinned),
                "keep_alive_s": m.policy.keep_alive_s, "loads": m.loads, "unloads": m.unloads,
                "waiting_s": waiting, "residency_reason": m.reason}

    # -- inside ---------------------------------------------------------------------------------

    def _idle(self, name: str, queued: Mapping[str, int], active: Mapping[str, int]) -> bool:
        m = self._models[name]
        return (m.state is ModelState.LOADED and not m.policy.pinned
                and not queued.get(name, 0) and not active.get(name, 0))

    def _expire(self, now: float, queued: Mapping[str, int], active: Mapping[str, int],
                out: list[Action]) -> None:
        for name, m in self._models.items():
            keep = m.policy.keep_alive_s
            if m.ordered == "unload" and m.state is not ModelState.LOADING:
                if m.state is not ModelState.LOADED:
                    m.ordered = ""  # not loaded (any more): nothing to do
                elif self._idle(name, queued, active):
                    m.ordered = ""
                    self._unload(m, "unloaded on request (POST /v1/models/{id}/unload)", out)
            elif keep >= 0 and self._idle(name, queued, active) and now - m.last_used >= keep:
                self._unload(m, f"idle for its keep-alive of {keep:g} s", out)

    def _load_wanted(self, now: float, queued: Mapping[str, int], active: Mapping[str, int],
                     out: list[Action]) -> None:
        wanted = sorted((m for m in self._models.values() if m.state is ModelState.UNLOADED
                         and (m.policy.pinned or m.wanted_since is not None)),
                        key=lambda m: (not m.policy.pinned, m.wanted_since or now, m.policy.name))
        making_room = sum(m.state is ModelState.UNLOADING for m in self._models.values())
        for m in wanted:
            if self.max_loaded is None or self.resident() < self.max_loaded:
                m.state, m.reason = ModelState.LOADING, ""
                m.loads += 1
                out.append(Load(m.policy.name))
            elif making_room:
                making_room -= 1  # an unload under way makes room for this one
            else:
                victims = [n for n in self._models if self._idle(n, queued, active)]
                if not victims:
                    return  # every resident model is busy or pinned: wait for one to go idle
                victim = self._models[min(victims, key=lambda n: (self._models[n].last_used, n))]
                self._unload(victim, f"least recently used, making room for {m.policy.name!r} "
                                     f"(max_loaded={self.max_loaded})", out)

    def _unload(self, m: _Model, reason: str, out: list[Action]) -> None:
        m.state, m.reason = ModelState.UNLOADING, reason
        m.unloads += 1
        out.append(Unload(m.policy.name, reason))
