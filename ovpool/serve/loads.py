"""Carrying ``Residency``'s decisions out on one host: a model is loaded by starting its workers'
processes, unloaded by draining them at the broker and stopping them once idle.

``ModelLoads.step`` takes the broker's STATUS (requests queued per model, this host's registered
workers and what they run) and tells the Supervisor which workers to start (``load``) and to stop
(``unload``); the Pool signals the processes (``to_stop``). What the broker may still dispatch to
a worker between the STATUS that found it idle and its drain is handed back when it stops
(DISCONNECT) and queues again: a request may wait for a reload, it is never lost nor run twice
(seeded replays, the broker forwards each token index once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ovpool.broker.residency import Residency
from ovpool.broker.residents import MIB, RESIDENT, Load, ModelState, Notice
from ovpool.serve.spec import PoolSpec
from ovpool.serve.supervisor import Supervisor, WorkerPhase

log = logging.getLogger(__name__)

DrainFn = Callable[[str], None]  # take a worker (by its exact registered id) out of placement


class ModelLoads:
    def __init__(self, spec: PoolSpec, supervisor: Supervisor, drain: DrainFn | None = None):
        mb = spec.max_loaded_mb
        self.residency = Residency(spec.policies(), spec.max_loaded, int(mb * MIB) if mb else None)
        self._workers = {name: model.name for name, (model, _) in spec.workers().items()}
        self._devices = {name: device for name, (_, device) in spec.workers().items()}
        # A request may name a model by any of its served names; residency knows catalog names.
        self._names = {alias: m.name for m in spec.models for alias in (m.name, *m.served_names)}
        self._chat = {m.name: int(m.chat) for m in spec.models if m.chat is not None}
        self._sources = {m.name: m.source for m in spec.models}
        self._supervisor = supervisor
        self._drain = drain
        self._draining: set[str] = set()  # worker names drained at the broker, not stopped yet
        self._orders_seen: set[str] = set()  # ids of the broker's model_orders carried out

    def names(self, model: str) -> list[str]:
        return [name for name, m in self._workers.items() if m == model]

    def model_of(self, worker: str) -> str:
        return self._workers[worker]

    def likely_next(self) -> list[str]:
        """The sources (as workers' ``--model`` names them) of the models that may load next:
        those asleep, most recently used first."""
        return [self._sources[m] for m in self.residency.asleep()]

    def step(self, now: float, status: dict | None, registered: dict[str, dict],
             memory: dict[str, int] | None = None) -> list[str]:
        """One round with the broker's ``status`` (None: no answer), this host's registered
        workers by name (their STATUS entries) and ``memory`` (bytes each running worker holds,
        by name; None: not measured this round): the workers to stop now (drained and idle)."""
        self._follow_supervisor(now, registered)
        if status is None:
            return []
        # Drained in an earlier round, so this STATUS came after the broker took them out.
        idle = [n for n in self._draining if not registered.get(n, {}).get("active", 0)]
        self._take_orders(status.get("model_orders", []), now)
        queued = status.get("queues", {})
        active: dict[str, int] = {}
        for name, entry in registered.items():
            model = self._workers[name]
            active[model] = active.get(model, 0) + int(entry.get("active", 0))
        keep = {self._names[m]: s for m, s in status.get("keep_alive", {}).items() if m in self._names}
        for action in self.residency.observe(now, queued, active, keep, self._by_model(memory)):
            if isinstance(action, Notice):
                log.warning("model %s: %s", action.model, action.text)
            elif isinstance(action, Load):
                log.info("loading model %s (requests wait for it)", action.model)
                for name in self.names(action.model):
                    self._supervisor.load(name, now)
            else:
                log.info("unloading model %s: %s", action.model, action.reason)
                idle += [n for n in self.names(action.model) if self._unload(n, action.reason, registered)]
        return idle

    def _by_model(self, memory: dict[str, int] | None) -> dict[str, dict[str, int]] | None:
        """Bytes per worker as residency takes them: model -> device -> bytes."""
        if memory is None:
            return None
        out: dict[str, dict[str, int]] = {}
        for name, used in memory.items():
            per_device = out.setdefault(self._workers[name], {})
            per_device[self._devices[name]] = per_device.get(self._devices[name], 0) + used
        return out

    def _take_orders(self, orders: list[dict], now: float) -> None:
        """POST /v1/models/{id}/load|unload, as the broker keeps them: each once, ours only."""
        models = set(self._workers.values())
        for order in orders:
            if order.get("id") not in self._orders_seen and order.get("model") in models:
                log.info("%s of model %s asked for", order["action"], order["model"])
                self.residency.order(order["model"], order["action"], now)
        self._orders_seen = {o.get("id") for o in orders}  # the broker keeps them a while only

    def stopped(self, name: str) -> None:
        """The Pool signalled ``name`` to stop (it is drained and idle); once all of its model's
        are, the next load may start beside their exit (Residency.stopping)."""
        self._draining.discard(name)
        model = self._workers[name]
        if not any(n in self._draining for n in self.names(model)):
            self.residency.stopping(model)

    def describe(self, worker: str, now: float) -> dict:
        model = self._workers[worker]
        chat = {"chat": self._chat[model]} if model in self._chat else {}
        return {**self.residency.describe(model, now), **chat}

    def _unload(self, name: str, reason: str, registered: dict[str, dict]) -> bool:
        """Drain ``name`` at the broker; True if the drain's reply shows it idle there, so it may
        stop now (else it stops in a later round, once a STATUS shows it idle)."""
        if self._supervisor.unload(name, reason):
            return False  # not running: nothing to stop
        self._draining.add(name)
        # By its registered id (``name@host:pid``): the broker matches a bare name on every host.
        worker_id = registered.get(name, {}).get("id")
        if self._drain is None or not worker_id:
            return False
        try:
            reply = self._drain(worker_id)
        except Exception as exc:  # a broker that does not answer: the worker hands back instead
            log.warning("could not drain worker %s before unloading it: %s", name, exc)
            return False
        entry = next((w for w in (reply or {}).get("workers", []) if w.get("id") == worker_id), None)
        return entry is not None and bool(entry.get("draining")) and not entry.get("active", 0)

    def _follow_supervisor(self, now: float, registered: dict[str, dict]) -> None:
        """Each model's state from its workers': registered, restarting, gone, or failing."""
        for model in {m for m in self._workers.values()}:
            phases = [self._supervisor.state(n) for n in self.names(model)]
            state = self.residency.state(model)
            if state is ModelState.LOADING and any(n in registered for n in self.names(model)):
                self.residency.loaded(model, now)
            elif state is ModelState.UNLOADING and all(p is WorkerPhase.UNLOADED for p in phases):
                self.residency.unloaded(model)
            elif state in RESIDENT and all(p is WorkerPhase.STOPPED for p in phases):
                self.residency.gone(model)  # drained for good by hand (`ovpool drain NAME`)
            elif state is ModelState.LOADED and not any(n in registered for n in self.names(model)) \
                    and WorkerPhase.READY not in phases:
                self.residency.restarting(model)
            if state is not ModelState.FAILED and phases and all(p is WorkerPhase.FAILING for p in phases):
                reasons = "; ".join(self._supervisor.describe(n)["reason"] for n in self.names(model))
                self.residency.failed(model, reasons)
