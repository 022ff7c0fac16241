"""The process side of serve's drains and rolling restarts: serve/drain.py decides, the Conductor
asks the broker to drain, marks the supervisor's workers and signals their processes.

``Orders`` carry serve's signals in: ``drain`` (SIGTERM, Ctrl-C: the pool drains, then serve
exits; a second one stops it at once), ``roll`` (SIGHUP, `ovpool restart --rolling`). A drain
started elsewhere (`ovpool drain`, the HTTP API's admin route) shows in the broker's status and
is followed the same way: a drain of the pool as serve's own, a drain of one of its workers by
stopping it once idle and leaving it stopped.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ovpool import json_files, timing
from ovpool.serve.child import ChildProcess
from ovpool.serve.drain import Drains, Roll, pool_idle
from ovpool.serve.supervisor import Supervisor, WorkerPhase

log = logging.getLogger(__name__)

BrokerDrainFn = Callable[[str, float], "dict | None"]  # (worker id or "" for the pool, timeout_s)
SettingsFn = Callable[[tuple[str, ...]], None]  # the --set items restarted workers take


@dataclass
class Orders:
    """What serve's signals ask (see the module docstring). ``restart_file``: where `ovpool
    restart --rolling --set ...` leaves the settings the restarted workers take (JSON list)."""

    stop: threading.Event = field(default_factory=threading.Event)
    drain: threading.Event = field(default_factory=threading.Event)
    roll: threading.Event = field(default_factory=threading.Event)
    restart_file: Path | None = None


class Conductor:
    """Follows ``Orders`` for the workers in ``children`` (the Pool's own dict, name -> process)
    of ``supervisor``; ``local_broker``: serve runs the broker (a drain is the pool's), else it
    joined a remote one (a drain is this host's workers')."""

    def __init__(self, supervisor: Supervisor, children: dict[str, ChildProcess], *, host: str,
                 local_broker: bool, broker_drain: BrokerDrainFn | None, shutdown_timeout_s: float,
                 take_settings: SettingsFn):
        self.supervisor, self.children, self.host = supervisor, children, host
        self.local_broker = local_broker
        self.shutdown_timeout_s = shutdown_timeout_s
        self._broker_drain, self._take_settings = broker_drain, take_settings
        self.drains = Drains()
        self.roll: Roll | None = None
        self.draining_until: float | None = None  # the pool drains: serve exits by then at last
        self._status: dict | None = None
        self._term_sent: dict[str, tuple[int, float]] = {}  # drained workers signalled: (pid, SIGKILL at)

    def describe(self) -> dict:
        return {"draining": self.draining_until is not None,
                "rolling": self.roll.current if self.roll is not None else None}

    def follow(self, orders: Orders, now: float, status: dict | None) -> dict | None:
        """One round with the broker's latest ``status``; returns the status to keep (a DRAIN's
        reply is a fresher one)."""
        self._status = status
        broker_drain = ((status or {}).get("draining") or {}).get("pool")
        if self.draining_until is None and (orders.drain.is_set() or broker_drain):
            self._drain_pool(now, broker_drain)
        if orders.roll.is_set():
            orders.roll.clear()
            self._start_roll(orders.restart_file)
        if self.roll is not None and self.draining_until is None:
            self._roll_round(now)
        registered = self._by_pid() if self._status is not None else None
        self._follow_worker_drains(now, registered or {})
        for name in self.drains.due(now, registered):
            self.drains.stopped(name)
            if name in self.children:
                self.children[name].signal(signal.SIGTERM)
                self._term_sent[name] = (self.children[name].pid, now + timing.SHUTDOWN_GRACE_S)
        self._kill_late(now)
        return self._status

    def drained(self, now: float) -> bool:
        """Whether the pool's drain is over: nothing left at the local broker (a worker host: no
        worker left running), or its time is up (the broker has failed what was left)."""
        if self.draining_until is None:
            return False
        if now >= self.draining_until + timing.HEARTBEAT_INTERVAL_S:
            log.warning("drain: shutdown_timeout_s is over; stopping with what is left")
            return True
        return pool_idle(self._status) if self.local_broker else not self.children

    def _kill_late(self, now: float) -> None:
        for name, (pid, deadline) in list(self._term_sent.items()):
            child = self.children.get(name)
            if child is None or child.pid != pid:  # it exited (and may run again as a new process)
                del self._term_sent[name]
            elif now >= deadline:
                child.signal(signal.SIGKILL)

    def _drain_pool(self, now: float, started: dict | None) -> None:
        """The whole pool drains: a local broker refuses new requests and serve exits once it has
        none left; on a worker host serve drains its own workers, which leave once idle."""
        timeout = started["deadline_in_s"] if started else self.shutdown_timeout_s
        self.draining_until = now + max(0.0, timeout)
        log.info("draining: requests already accepted have %.1f s to finish (shutdown_timeout_s); "
                 "%s", timeout, "new ones are refused" if self.local_broker
                 else "the broker gives new ones to the other hosts")
        if self.local_broker:
            if not started:
                self._ask_broker("", timeout)
            return
        self.supervisor.stop()
        for name in list(self.children):
            self._drain_worker(name, now, "retire", timeout)

    def _drain_worker(self, name: str, now: float, then: str, timeout_s: float) -> None:
        pid = self.supervisor.pid(name)
        entry = self._by_pid().get(pid)
        if entry is not None and not entry.get("draining"):
            self._ask_broker(entry["id"], timeout_s)
        if self.supervisor.state(name) is not WorkerPhase.STOPPED:
            self.supervisor.draining(name, then)
        self.drains.begin(name, pid, now, timeout_s)
        log.info("worker %s drains (%s): stopped once idle, within %.1f s", name, then, timeout_s)

    def _follow_worker_drains(self, now: float, registered: dict[int, dict]) -> None:
        """A worker the broker drains that serve did not ask for (`ovpool drain NAME`): it stops
        once idle and stays stopped."""
        for name, child in self.children.items():
            entry = registered.get(child.pid)
            if entry is not None and entry.get("draining") and name not in self.drains \
                    and self.supervisor.state(name) is not WorkerPhase.DRAINING:
                self._drain_worker(name, now, "retire", self.shutdown_timeout_s)

    def _start_roll(self, restart_file: Path | None) -> None:
        if self.roll is not None:
            log.warning("a rolling restart is under way (at %s); this one is ignored", self.roll.current)
            return
        items = _restart_settings(restart_file)
        if items:
            self._take_settings(items)
            log.info("the restarted workers take %s", ", ".join(items))
        self.roll = Roll(list(self.supervisor.devices))
        log.info("rolling restart of %d worker(s), one at a time", len(self.supervisor.devices))

    def _roll_round(self, now: float) -> None:
        phases = {n: (self.supervisor.state(n), self.supervisor.pid(n)) for n in self.supervisor.devices}
        for action, name in self.roll.step(phases):
            if action == "drain":
                self._drain_worker(name, now, "restart", self.shutdown_timeout_s)
            elif action == "revive":
                self.supervisor.revive(name, now)
            elif action == "done":
                log.info("rolling restart done: every worker runs a new process")
                self.roll = None
            else:
                log.error("rolling restart stopped: worker %s did not start again (%s); the others "
                          "keep their processes", name, self.supervisor.describe(name)["reason"])
                self.roll = None

    def _ask_broker(self, worker: str, timeout_s: float) -> None:
        if self._broker_drain is None:
            return
        try:
            self._status = self._broker_drain(worker, timeout_s) or self._status
        except Exception as exc:  # the broker is down: the drain goes on by the deadline alone
            log.warning("could not ask the broker to drain %s: %s", worker or "the pool", exc)

    def _by_pid(self) -> dict[int, dict]:
        """This host's workers in the broker's status, by pid."""
        workers = (self._status or {}).get("workers", [])
        return {w.get("pid"): w for w in workers if w.get("host") == self.host}


def _restart_settings(restart_file: Path | None) -> tuple[str, ...]:
    """The --set items `ovpool restart --rolling` left (the file is read once, then removed)."""
    if restart_file is None or not restart_file.exists():
        return ()
    try:
        items = tuple(str(i) for i in json_files.loads(restart_file.read_text()))
        restart_file.unlink()
    except (OSError, ValueError, TypeError) as exc:
        log.error("cannot read the restart's settings in %s: %s; restarting without them", restart_file, exc)
        return ()
    return items
