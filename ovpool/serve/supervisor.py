"""Worker supervision as pure logic: events in, decisions out; no processes, no clocks.

The process layer (ovpool.serve.pool) reports what happened (a worker started, became ready,
exited with a code) with the time it happened, asks which workers are due to be (re)started,
and publishes ``view()``. Keeping the policy here lets tests drive hours of crash loops in
microseconds.

A worker's life::

    starting ──ready──► ready
       │                  │
       └──exit──► backoff ◄┘ (restart at t + delay)     backoff ──due──► starting
          │          │
          │          └── GIVE_UP_AFTER fast failures in a row ──► failing (never restarted)
          └── exit status errors.EXIT_PERMANENT before ready ───► failing (a bad model file,
              an unsupported architecture: the next start would fail the same way)

A run is a *fast failure* when it exits before it was ready or within ``stable_after_s`` of its
start; the delay doubles with each fast failure in a row, capped, and a stable run resets it.

A planned exit is none of these: ``draining(name, then)`` marks a worker serve drains (it shows as
``draining``); when it exits it is restarted at once (``then`` "restart": a rolling restart, the
exit is not counted as a failure) or left stopped (``then`` "retire": `ovpool drain`, a drain of
serve on a worker host). ``revive`` restarts a worker that is backing off or failing now (a
rolling restart gives a failing worker its new binary, settings or model file too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ovpool import timing
from ovpool.errors import EXIT_PERMANENT


class WorkerPhase(str, Enum):
    STARTING = "starting"
    READY = "ready"
    BACKOFF = "backoff"
    FAILING = "failing"
    STOPPED = "stopped"
    DRAINING = "draining"  # serve drains it: a planned exit follows (restart or retire)
    UNLOADED = "unloaded"  # a model's worker not running on purpose (ovpool.broker.residency)


@dataclass(frozen=True)
class RestartPolicy:
    backoff_min_s: float = timing.SUPERVISOR_BACKOFF_MIN_S
    backoff_max_s: float = timing.SUPERVISOR_BACKOFF_MAX_S
    stable_after_s: float = timing.SUPERVISOR_STABLE_AFTER_S
    give_up_after: int = timing.SUPERVISOR_GIVE_UP_AFTER

    def delay(self, fast_failures: int) -> float:
        """Wait before the next start after ``fast_failures`` fast failures in a row (0: a stable run)."""
        return min(self.backoff_max_s, self.backoff_min_s * 2 ** max(0, fast_failures - 1))


@dataclass
class _Worker:
    name: str
    device: str
    state: WorkerPhase = WorkerPhase.BACKOFF
    pid: int | None = None
    started_at: float = 0.0
    ready: bool = False
    restart_at: float = 0.0
    restarts: int = 0
    fast_failures: int = 0
    last_exit: int | None = None
    reason: str = ""
    unloading: bool = False
    then: str = ""  # what follows the planned exit of a draining worker: "restart" or "retire"


@dataclass
class Supervisor:
    """Decides when each named worker (re)starts and when it is given up on."""

    devices: dict[str, str]
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    unloaded: frozenset[str] = frozenset()  # workers that start only when ``load`` asks

    def __post_init__(self) -> None:
        self._workers = {name: _Worker(name, device) for name, device in self.devices.items()}
        for name in self.unloaded:
            self._workers[name].state = WorkerPhase.UNLOADED
        self._stopping = False

    def due(self, now: float) -> list[str]:
        """Workers to start now: never started yet, or their backoff has expired."""
        if self._stopping:
            return []
        return [w.name for w in self._workers.values()
                if w.state is WorkerPhase.BACKOFF and w.restart_at <= now]

    def next_due(self) -> float | None:
        """When the earliest pending restart is due (None: nothing pending)."""
        times = [w.restart_at for w in self._workers.values() if w.state is WorkerPhase.BACKOFF]
        return None if self._stopping or not times else min(times)

    def started(self, name: str, pid: int, now: float) -> None:
        w = self._workers[name]
        if w.last_exit is not None:
            w.restarts += 1
        w.state, w.pid, w.started_at, w.ready = WorkerPhase.STARTING, pid, now, False

    def ready(self, name: str) -> None:
        w = self._workers[name]
        if w.state is WorkerPhase.STARTING:
            w.state, w.ready, w.reason = WorkerPhase.READY, True, ""

    def exited(self, name: str, code: int, now: float, reason: str = "") -> WorkerPhase:
        """Record an exit; the returned state says what happens next (backoff, failing, stopped)."""
        w = self._workers[name]
        w.pid, w.last_exit = None, code
        if w.unloading:
            w.state, w.unloading, w.ready = WorkerPhase.UNLOADED, False, False
            return w.state
        if self._stopping:
            w.state, w.reason = WorkerPhase.STOPPED, "stopped by serve"
            return w.state
        if w.state is WorkerPhase.DRAINING:
            return self._planned_exit(w, now)
        w.reason = reason or f"exited with status {code}"
        fast = not w.ready or now - w.started_at < self.policy.stable_after_s
        w.fast_failures = w.fast_failures + 1 if fast else 0
        if code == EXIT_PERMANENT and not w.ready:
            w.state = WorkerPhase.FAILING
            w.reason = f"{w.reason} (not retried: a restart cannot change it; fix it and restart serve)"
        elif w.fast_failures >= self.policy.give_up_after:
            w.state = WorkerPhase.FAILING
            w.reason = f"gave up after {w.fast_failures} failed starts in a row; last: {w.reason}"
        else:
            w.state, w.restart_at = WorkerPhase.BACKOFF, now + self.policy.delay(w.fast_failures)
        return w.state

    def load(self, name: str, now: float) -> None:
        """Start an unloaded worker (or one drained for good) now: its model is wanted again."""
        w = self._workers[name]
        if w.state in (WorkerPhase.UNLOADED, WorkerPhase.STOPPED) and not self._stopping:
            w.state, w.restart_at, w.fast_failures, w.unloading = WorkerPhase.BACKOFF, now, 0, False

    def unload(self, name: str, reason: str) -> bool:
        """Its model is unloaded: its next exit is expected and not restarted. True: it is not
        running (nothing to wait for)."""
        w = self._workers[name]
        w.reason = f"unloaded: {reason}"
        if w.state in (WorkerPhase.STARTING, WorkerPhase.READY):
            w.unloading = True
            return False
        if w.state is WorkerPhase.BACKOFF:
            w.state = WorkerPhase.UNLOADED
        return True

    def draining(self, name: str, then: str) -> None:
        """Serve drains ``name`` (a running worker); its next exit is planned: see the docstring."""
        w = self._workers[name]
        assert then in ("restart", "retire"), then
        w.state, w.then, w.ready = WorkerPhase.DRAINING, then, False
        w.reason = "draining: " + ("rolling restart" if then == "restart" else "stops once idle")

    def revive(self, name: str, now: float) -> None:
        """Start ``name`` now if it waits for a restart or was given up on (with a clean slate)."""
        w = self._workers[name]
        if w.state in (WorkerPhase.BACKOFF, WorkerPhase.FAILING, WorkerPhase.STOPPED):
            w.state, w.restart_at, w.fast_failures = WorkerPhase.BACKOFF, now, 0

    def _planned_exit(self, w: _Worker, now: float) -> WorkerPhase:
        if w.then == "restart":
            w.state, w.restart_at, w.reason = WorkerPhase.BACKOFF, now, "replaced by a rolling restart"
        else:
            w.state, w.reason = WorkerPhase.STOPPED, "drained"
        w.then = ""
        return w.state

    def pid(self, name: str) -> int | None:
        return self._workers[name].pid

    def stop(self) -> None:
        """Shutting down: no more restarts; later exits are expected."""
        self._stopping = True

    def state(self, name: str) -> WorkerPhase:
        return self._workers[name].state

    def restart_at(self, name: str) -> float:
        return self._workers[name].restart_at

    def describe(self, name: str) -> dict:
        """One worker as serve publishes it for `ovpool status`."""
        w = self._workers[name]
        return {"name": w.name, "device": w.device, "state": w.state.value, "pid": w.pid,
                "restarts": w.restarts, "last_exit": w.last_exit, "reason": w.reason}

    def view(self) -> list[dict]:
        return [self.describe(name) for name in self._workers]
