"""Serve's drains and rolling restarts as pure logic: the broker's status and the supervisor's
phases in, which worker to drain, stop or start out; time passed in.

A drained worker gets no new request from the broker (protocol.Drain names it); serve stops it
once the broker shows it idle, or at its deadline (``shutdown_timeout_s``): what it still runs
then it hands back as it exits (DISCONNECT), and the broker gives those requests to another
worker, where they replay from their seeds and their streams go on exactly once, as after a
crash. A rolling restart (``Roll``) does that to one worker at a time and starts the next only
once the one before is ready again with its new process; it stops at a worker whose new process
fails, so a bad binary, setting or model file takes one worker down, never the pool.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ovpool.serve.supervisor import WorkerPhase

Registered = dict[int, dict]  # pid -> the broker's STATUS entry of that worker of this host


@dataclass
class _Draining:
    pid: int
    deadline: float


class Drains:
    """The workers serve drains; ``due`` says which to stop now."""

    def __init__(self) -> None:
        self._draining: dict[str, _Draining] = {}

    def begin(self, name: str, pid: int, now: float, timeout_s: float) -> None:
        self._draining[name] = _Draining(pid, now + timeout_s)

    def __contains__(self, name: str) -> bool:
        return name in self._draining

    def __bool__(self) -> bool:
        return bool(self._draining)

    def due(self, now: float, registered: Registered | None) -> list[str]:
        """Drained workers to stop: idle at the broker (none of its requests left, or not
        registered there at all), or past their deadline. ``registered`` None: no status (the
        broker did not answer), so only the deadline counts."""
        return [name for name, d in self._draining.items()
                if now >= d.deadline or (registered is not None and _idle(registered.get(d.pid)))]

    def stopped(self, name: str) -> None:
        self._draining.pop(name, None)


def _idle(entry: dict | None) -> bool:
    return entry is None or (bool(entry.get("draining")) and entry.get("active") == 0)


def pool_idle(status: dict | None) -> bool:
    """Whether a draining broker has nothing left: no request in flight or queued, no stream
    whose tokens still wait for their reader."""
    if status is None:
        return False
    queued = sum(n for n in (status.get("queues") or {}).values() if isinstance(n, int))
    return status.get("in_flight") == 0 and queued == 0 and (status.get("streams") or {}).get("open", 0) == 0


Phases = dict[str, tuple[WorkerPhase, "int | None"]]  # name -> (its phase, its pid)


class Roll:
    """A rolling restart of ``names``, in order. ``step`` gives the actions of this round, each
    ``(action, name)``: "drain" (a running worker: drain it, restart it once stopped), "revive" (a
    worker with no process: start it now), "done" (every worker replaced), "failed" (``name``'s
    new process failed: the roll stops there)."""

    def __init__(self, names: list[str]):
        self._todo = deque(names)
        self.current: str | None = None
        self._old_pid: int | None = None

    def step(self, phases: Phases) -> list[tuple[str, str]]:
        if self.current is not None:
            phase, pid = phases[self.current]
            if phase is WorkerPhase.FAILING:
                return [("failed", self.current)]
            if phase is not WorkerPhase.READY or pid == self._old_pid:
                return []  # draining, stopping, starting: the next waits
        if not self._todo:
            self.current = None
            return [("done", "")]
        self.current = name = self._todo.popleft()
        phase, pid = phases[name]
        self._old_pid = pid if phase is WorkerPhase.READY else None
        if phase is WorkerPhase.READY:
            return [("drain", name)]
        if phase in (WorkerPhase.BACKOFF, WorkerPhase.FAILING, WorkerPhase.STOPPED):
            return [("revive", name)]
        if phase is WorkerPhase.STARTING:
            return []  # already a new process: the next waits until it is ready
        self.current = None  # drained for good, or unloaded: not this roll's to start
        return self.step(phases)
