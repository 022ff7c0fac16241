"""A pool around a Residency for its tests: loads and unloads finish when told, requests queue,
run and end, time passes, requests set keep-alives and workers hold memory; each observation
checks what must always hold (never unload a busy or pinned model, never over max_loaded)."""

from __future__ import annotations

from ovpool.broker.residency import Residency
from ovpool.broker.residents import RESIDENT, ModelPolicy, ModelState, Notice, Unload

NAMES = ("a", "b", "c")


class World:
    """``sizes``: the bytes each model's workers hold once loaded (half of it while loading), per
    device of its policy; with ``max_bytes``, Residency's byte budget."""

    def __init__(self, policies: list[ModelPolicy], max_loaded: int | None,
                 max_bytes: int | None = None, sizes: dict[str, int] | None = None):
        self.r = Residency(policies, max_loaded, max_bytes)
        self.policies = {p.name: p for p in policies}
        self.max_loaded, self.max_bytes, self.sizes = max_loaded, max_bytes, sizes or {}
        self.queued = dict.fromkeys(self.policies, 0)
        self.active = dict.fromkeys(self.queued, 0)
        self.keep_alive: dict[str, float] = {}  # the broker's STATUS keep_alive
        self.pinned = {p.name for p in policies if p.pinned}
        self.loads: list[str] = []
        self.notices: list[Notice] = []
        self.now = 0.0

    def memory(self) -> dict[str, dict[str, int]]:
        out = {}
        for name, p in self.policies.items():
            state = self.r.state(name)
            held = self.sizes.get(name, 0) // (2 if state is ModelState.LOADING else 1)
            out[name] = {d: held for d in p.devices} if state in RESIDENT else {}
        return out

    def observe(self) -> list:
        actions = self.r.observe(self.now, self.queued, self.active, self.keep_alive, self.memory())
        for action in actions:
            if isinstance(action, Unload):  # never under requests in flight or waiting, never a pin
                assert not self.active[action.model] and not self.queued[action.model]
                assert action.model not in self.pinned
            elif isinstance(action, Notice):
                self.notices.append(action)
            else:
                self.loads.append(action.model)
        if self.max_loaded is not None:
            assert self.r.resident() <= self.max_loaded
        return actions

    def step(self, event: tuple[str, str]) -> None:
        kind, name = event
        state = self.r.state(name)
        if kind == "submit":
            self.queued[name] += 1
        elif kind == "ready" and state is ModelState.LOADING:
            self.r.loaded(name, self.now)
        elif kind == "gone" and state is ModelState.UNLOADING:
            self.r.unloaded(name)
        elif kind == "stopping":  # its workers told to exit (idle, drained)
            self.r.stopping(name)
        elif kind == "dispatch" and state is ModelState.LOADED and self.queued[name]:
            self.queued[name] -= 1
            self.active[name] += 1
        elif kind == "finish" and self.active[name]:
            self.active[name] -= 1
        elif kind == "tick":
            self.now += 61.0
        elif kind in ("load", "unload"):  # POST /v1/models/{id}/load|unload
            self.r.order(name, kind, self.now)
        self.observe()

    def settle(self) -> None:
        """No new requests: every pending load, unload and request goes on until nothing waits
        and nothing is under way."""
        for _ in range(200):
            for name in self.policies:
                for kind in ("ready", "stopping", "gone", "dispatch", "finish"):
                    self.step((kind, name))
            busy = any(self.queued.values()) or any(self.active.values())
            moving = any(self.r.state(n) in (ModelState.LOADING, ModelState.UNLOADING) for n in self.policies)
            if not busy and not moving:
                return
        raise AssertionError(f"requests still wait: {self.queued}, states "
                             f"{[self.r.state(n).value for n in self.policies]}")

    def used(self, device: str) -> tuple[int, list[str]]:
        """Bytes of the models resident on ``device``, and which unpinned ones they are."""
        on = [n for n, p in self.policies.items() if device in p.devices and self.r.state(n) in RESIDENT]
        return sum(self.sizes.get(n, 0) for n in on), [n for n in on if n not in self.pinned]
