"""Which models of a pool are loaded, as pure logic: observations in, Load/Unload actions out.

A pool serves a catalog of models, not all of them loaded at once. ``Residency`` decides, for the
models of one ``ovpool serve`` (one host's devices), which to load and which to unload:

- a model with requests queued and none of its workers up is loaded (one Load however many
  requests wait: concurrent first requests for a cold model cause one load);
- at most ``max_loaded`` models are resident (loading, loaded or unloading) at any moment; when a
  load would pass it, the least recently used loaded model that is neither pinned nor busy
  (requests in flight or queued) is unloaded first, and the load follows once it has gone, or on
  CPU once its workers are idle and told to exit (``stopping``: their exit overlaps the load);
- with ``max_bytes`` (a byte budget per device, the workers' PSS as serve measures it), the models
  resident on a device take at most that much once settled: over it, the least recently used idle
  unpinned model there unloads, never a busy one; a load waits for room when its model's size is
  known from an earlier load (else it loads, and the measure decides after); a model over the
  budget alone (beside pins) stays loaded and is reported (a Notice, its reason);
- a loaded model idle for its keep-alive (seconds; -1 never) is unloaded; pinned models never are.
  The keep-alive is the model's own unless its latest request set one (SUBMIT.keep_alive_s, as the
  broker's STATUS ``keep_alive`` reports it): the last request wins, as in Ollama;
- a model whose load failed stays ``failed`` (the broker fails its requests naming why: the
  worker's LOAD_FAILED, or the supervisor's report of a worker failing for good).

Nothing here touches a process or a socket, and time is passed in, so the property tests drive
hours of traffic in microseconds (tests/test_broker_residency.py). Its actions are carried out by
``ovpool.serve.pool``, which starts and stops one worker process per model and device.

Why a process per model rather than a worker swapping its model: docs/operations.md, "Many models".
"""

from __future__ import annotations

from collections.abc import Mapping

from ovpool.broker.residents import (
    MIB,
    RESIDENT,
    Action,
    Load,
    ModelPolicy,
    ModelState,
    Notice,
    Resident,
    Unload,
    Usage,
)
from ovpool.errors import ConfigError


class Residency:
    """``max_loaded`` None: no budget of models; ``max_bytes`` None: none of bytes. Pinned models
    are loaded at the first ``observe``; pins that leave no room for the others are a ConfigError."""

    def __init__(self, models: list[ModelPolicy], max_loaded: int | None = None,
                 max_bytes: int | None = None):
        pinned = [m.name for m in models if m.pinned]
        if max_loaded is not None and pinned and len(pinned) >= max_loaded and len(models) > max_loaded:
            raise ConfigError(f"the pinned models ({', '.join(pinned)}) take the whole budget of "
                              f"max_loaded={max_loaded}, so the others could never load; pin fewer "
                              "or raise --max-loaded")
        self.max_loaded, self.max_bytes = max_loaded, max_bytes
        self._models = {m.name: Resident(m) for m in models}
        self._devices = sorted({d for m in models for d in m.devices})

    # -- events ---------------------------------------------------------------------------------

    def observe(self, now: float, queued: Usage, active: Usage, keep_alive: Mapping[str, float] | None = None,
                memory: Mapping[str, Mapping[str, int]] | None = None) -> list[Action]:
        """The broker's view at ``now`` (requests queued and in flight per model, the keep-alive
        the latest request for a model set) and serve's ``memory`` (model -> device -> bytes its
        workers hold; None: not measured this round): the actions due."""
        for name, m in self._models.items():
            m.keep_alive_s = (keep_alive or {}).get(name)
            if memory is not None:
                self._measured(m, memory.get(name, {}))
            if queued.get(name, 0) or active.get(name, 0):
                m.last_used = now
                if m.wanted_since is None and m.state not in (ModelState.LOADED, ModelState.FAILED):
                    m.wanted_since = now
            elif m.state is not ModelState.LOADING and m.ordered != "load":
                m.wanted_since = None
        out: list[Action] = []
        self._expire(now, queued, active, out)
        self._fit_bytes(queued, active, out)
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

    def stopping(self, model: str) -> None:
        """The workers of an unloading ``model`` are idle, out of placement and told to exit. On
        CPU the next load need not wait for their exit; the byte budget counts their memory until
        they have gone (on a GPU both wait: device memory comes back only at the exit)."""
        m = self._models[model]
        if m.state is ModelState.UNLOADING and all(d.startswith("CPU") for d in m.policy.devices):
            m.leaving = True

    def unloaded(self, model: str) -> None:
        """The workers of ``model`` that an Unload stopped have exited."""
        m = self._models[model]
        if m.state is ModelState.UNLOADING:
            m.state, m.leaving = ModelState.UNLOADED, False

    def gone(self, model: str) -> None:
        """The workers of ``model`` were stopped by someone else (a drain): it is not loaded."""
        m = self._models[model]
        if m.state in RESIDENT:
            m.state, m.reason, m.leaving = ModelState.UNLOADED, "its workers were drained", False

    def failed(self, model: str, reason: str) -> None:
        """``model`` cannot load (a bad file, a worker the supervisor gave up on): for good."""
        m = self._models[model]
        m.state, m.reason, m.wanted_since, m.leaving = ModelState.FAILED, reason, None, False

    # -- views ----------------------------------------------------------------------------------

    def state(self, model: str) -> ModelState:
        return self._models[model].state

    def asleep(self) -> list[str]:
        """The models not loaded, loading nor failed, most recently used first."""
        asleep = [m for m in self._models.values() if m.state is ModelState.UNLOADED]
        return [m.policy.name for m in sorted(asleep, key=lambda m: -m.last_used)]

    def resident(self) -> int:
        """Models within the count budget: loading, loaded, or unloading and not yet leaving."""
        return sum(m.state in RESIDENT and not m.leaving for m in self._models.values())

    def describe(self, model: str, now: float) -> dict:
        """One model as serve reports it (flat: the broker keeps maps of text and numbers)."""
        m = self._models[model]
        waiting = round(now - m.wanted_since, 3) if m.wanted_since is not None else 0.0
        return {"model": model, "residency": m.state.value, "pinned": int(m.policy.pinned),
                "keep_alive_s": m.keep, "keep_alive_from": "setting" if m.keep_alive_s is None else "request",
                "memory_mib": round(sum(m.memory.values()) / MIB, 1), "loads": m.loads,
                "unloads": m.unloads, "waiting_s": waiting, "residency_reason": m.reason}

    # -- inside ---------------------------------------------------------------------------------

    def _idle(self, name: str, queued: Usage, active: Usage) -> bool:
        m = self._models[name]
        return (m.state is ModelState.LOADED and not m.policy.pinned
                and not queued.get(name, 0) and not active.get(name, 0))

    def _measured(self, m: Resident, memory: Mapping[str, int]) -> None:
        """Its workers' bytes per device now; what a loaded model holds is its size next time."""
        m.memory = dict(memory) if m.state in RESIDENT else {}
        if m.state is ModelState.LOADED:
            m.known.update((d, b) for d, b in memory.items() if b > 0)

    def _expire(self, now: float, queued: Usage, active: Usage, out: list[Action]) -> None:
        for name, m in self._models.items():
            keep = m.keep
            if m.ordered == "unload" and m.state is not ModelState.LOADING:
                if m.state is not ModelState.LOADED:
                    m.ordered = ""  # not loaded (any more): nothing to do
                elif self._idle(name, queued, active):
                    m.ordered = ""
                    self._unload(m, "unloaded on request (POST /v1/models/{id}/unload)", out)
            elif keep >= 0 and self._idle(name, queued, active) and now - m.last_used >= keep:
                asked = "" if m.keep_alive_s is None else " (its latest request's keep_alive)"
                self._unload(m, f"idle for its keep-alive of {keep:g} s{asked}", out)

    # -- the byte budget ------------------------------------------------------------------------

    def _on(self, device: str, *states: ModelState) -> list[Resident]:
        return [m for m in self._models.values() if m.state in states and device in m.policy.devices]

    def _used(self, device: str, *states: ModelState) -> int:
        return sum(m.size(device) for m in self._on(device, *states))

    def _fit_bytes(self, queued: Usage, active: Usage, out: list[Action]) -> None:
        """Over the budget on a device: its least recently used idle models unload (not counting
        those already unloading) until it fits, or one unpinned model is left (beside any pins):
        that one stays, as serving beats an empty device, and is reported once."""
        if self.max_bytes is None:
            return
        for device in self._devices:
            while (used := self._used(device, ModelState.LOADING, ModelState.LOADED)) > self.max_bytes:
                staying = [m for m in self._on(device, ModelState.LOADING, ModelState.LOADED)
                           if not m.policy.pinned]
                if len(staying) <= 1:
                    self._alone(staying, device, used, out)
                    break
                if not self._make_room(None, device, queued, active, out):
                    break  # the busy ones unload as they go idle

    def _alone(self, staying: list[Resident], device: str, used: int, out: list[Action]) -> None:
        if not staying or staying[0].noticed or staying[0].state is ModelState.LOADING:
            return
        m = staying[0]
        m.noticed = True
        m.reason = (f"{m.policy.name!r} alone holds {m.size(device) / MIB:.0f} MiB on {device} (with any "
                    f"pinned models: {used / MIB:.0f} MiB), over max_loaded_mb={self.max_bytes / MIB:g}: "
                    "it stays loaded and serves; raise max_loaded_mb to load another model beside it")
        out.append(Notice(m.policy.name, m.reason))

    def _no_room(self, m: Resident) -> str | None:
        """A device of ``m`` where its size from its last load does not fit beside what is there
        (unloading models included: their memory is not back yet); None: it fits."""
        if self.max_bytes is None:
            return None
        for device in m.policy.devices:
            used = self._used(device, *RESIDENT)
            if used and used + m.known.get(device, 0) > self.max_bytes:
                return device
        return None

    def _make_room(self, m: Resident | None, device: str | None, queued: Usage, active: Usage,
                   out: list[Action]) -> bool:
        """Unload the least recently used idle model (on ``device`` if given) to make room for
        ``m`` (None: the budget alone); False if none is idle."""
        victims = [n for n, v in self._models.items() if v is not m and self._idle(n, queued, active)
                   and (device is None or device in v.policy.devices)]
        if not victims:
            return False
        victim = self._models[min(victims, key=lambda n: (self._models[n].last_used, n))]
        budget = (f"max_loaded={self.max_loaded}" if device is None
                  else f"max_loaded_mb={self.max_bytes / MIB:g} on {device}")
        why = f"making room for {m.policy.name!r}" if m is not None else "over the budget"
        self._unload(victim, f"least recently used, {why} ({budget})", out)
        return True

    # -- loads ----------------------------------------------------------------------------------

    def _load_wanted(self, now: float, queued: Usage, active: Usage, out: list[Action]) -> None:
        wanted = sorted((m for m in self._models.values() if m.state is ModelState.UNLOADED
                         and (m.policy.pinned or m.wanted_since is not None)),
                        key=lambda m: (not m.policy.pinned, m.wanted_since or now, m.policy.name))
        making_room = sum(m.state is ModelState.UNLOADING and not m.leaving for m in self._models.values())
        for m in wanted:
            if self.max_loaded is not None and self.resident() >= self.max_loaded:
                if making_room:
                    making_room -= 1  # an unload under way makes room for this one
                elif not self._make_room(m, None, queued, active, out):
                    return  # every resident model is busy or pinned: wait for one to go idle
            elif (device := self._no_room(m)) is None or not self._waits(m, device, queued, active, out):
                self._load(m, out)

    def _waits(self, m: Resident, device: str, queued: Usage, active: Usage, out: list[Action]) -> bool:
        """Whether ``m`` waits for bytes on ``device``: an unload under way there, one started now,
        or busy models there that will go idle; with only pins there it loads beside them."""
        if self._on(device, ModelState.UNLOADING) or self._make_room(m, device, queued, active, out):
            return True
        return any(not v.policy.pinned for v in self._on(device, *RESIDENT))

    def _load(self, m: Resident, out: list[Action]) -> None:
        m.state, m.reason, m.noticed = ModelState.LOADING, "", False
        m.loads += 1
        out.append(Load(m.policy.name))

    def _unload(self, m: Resident, reason: str, out: list[Action]) -> None:
        m.state, m.reason = ModelState.UNLOADING, reason
        m.unloads += 1
        out.append(Unload(m.policy.name, reason))
