"""The process layer of ``ovpool serve``: starts the children, feeds the Supervisor, publishes its view.

``Pool`` owns the broker and HTTP API services (ovpool.serve.service; no broker when it joins a
remote one) and one ChildProcess per worker. Readiness comes from the broker itself: a worker is
ready once the broker's status lists a worker with its host and pid, which is the only readiness a
client cares about. The supervisor's view (including workers that never registered) goes to
``publish`` once per interval. Once every worker has failed for good serve ends (ConfigError)
unless ``keep_up``: a pool that can never serve should not look alive.

``Orders`` carry serve's signals in: ``drain`` (SIGTERM, Ctrl-C: the pool drains, then serve
exits; a second one stops it at once), ``roll`` (SIGHUP, `ovpool restart --rolling`: a rolling
restart, serve/drain.py). A drain started elsewhere (`ovpool drain`, the HTTP API's admin
route) shows in the broker's status and is followed the same way.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ovpool import timing
from ovpool.errors import ConfigError
from ovpool.serve.child import ChildProcess
from ovpool.serve.drain import Drains, Roll, pool_idle
from ovpool.serve.loads import DrainFn, ModelLoads
from ovpool.serve.service import Service
from ovpool.serve.spec import PoolSpec
from ovpool.serve.supervisor import RestartPolicy, Supervisor, WorkerPhase

log = logging.getLogger(__name__)

StatusFn = Callable[[], "dict | None"]
PublishFn = Callable[[dict], None]
BrokerDrainFn = Callable[[str, float], "dict | None"]  # (worker id or "" for the pool, timeout_s)


@dataclass
class Orders:
    """What serve's signals ask (see the module docstring). ``restart_file``: where `ovpool
    restart --rolling --set ...` leaves the settings the restarted workers take (JSON list)."""

    stop: threading.Event = field(default_factory=threading.Event)
    drain: threading.Event = field(default_factory=threading.Event)
    roll: threading.Event = field(default_factory=threading.Event)
    restart_file: Path | None = None


class Pool:
    """``with Pool(spec, status, publish) as pool: pool.run(stop_event)``; leaving stops every child."""

    def __init__(self, spec: PoolSpec, status: StatusFn, publish: PublishFn,
                 env: dict[str, str] | None = None, policy: RestartPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic, http_env: dict[str, str] | None = None,
                 broker_env: dict[str, str] | None = None, keep_up: bool = False,
                 drain: DrainFn | None = None, broker_drain: BrokerDrainFn | None = None,
                 shutdown_timeout_s: float = 30.0):
        self.spec, self.keep_up = spec, keep_up
        self._broker_drain, self.shutdown_timeout_s = broker_drain, shutdown_timeout_s
        self.drains = Drains()
        self.roll: Roll | None = None
        self.draining_until: float | None = None  # the pool drains: serve exits by then at last
        self._term_sent: dict[str, tuple[int, float]] = {}  # drained workers signalled: (pid, SIGKILL at)
        self._status, self._publish, self._env, self._clock = status, publish, env, clock
        self._workers = spec.workers()
        policy = policy or RestartPolicy()
        self.supervisor = Supervisor({n: d for n, (_, d) in self._workers.items()}, policy,
                                     unloaded=frozenset(self._workers) if spec.on_demand else frozenset())
        self.loads = ModelLoads(spec, self.supervisor, drain)
        self._stop_by: dict[str, float] = {}  # unloading workers signalled: SIGKILL after this
        # The services' environments may carry keys (kept off command lines). A crashed broker
        # restarts at once: clients wait only connect_timeout_s (2 s) for a dropped connection.
        broker_policy = dataclasses.replace(policy, backoff_min_s=timing.POLL_INTERVAL_S)
        self._broker = (Service("broker", f"the broker on {spec.bind}", spec.broker_argv(), spec.bind,
                                broker_env or env, broker_policy) if spec.bind is not None else None)
        self._http = (Service("http", f"the HTTP API on http://{spec.http}/v1", spec.api_argv(), spec.http,
                              http_env or env, policy) if spec.http else None)
        self._children: dict[str, ChildProcess] = {}
        self._broker_status: dict | None = None
        self._host = socket.gethostname()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._http is not None:  # first: no new requests while the workers drain
            self._http.stop()
        self.supervisor.stop()
        workers = list(self._children.values())
        for child in workers:  # all at once: each worker drains its requests in parallel
            child.signal(signal.SIGTERM)
        for child in workers:
            self.supervisor.exited(child.name, child.stop(), self._clock())
        self._children.clear()
        if self._broker is not None:
            self._broker.stop()
        self._publish_view()

    def run(self, stop: threading.Event | Orders) -> None:
        """Supervise until ``stop`` is set (or a drain has ended); a broker or HTTP API that keeps
        failing at start raises ConfigError, every worker failing for good ConfigError (unless
        ``keep_up``)."""
        orders = stop if isinstance(stop, Orders) else Orders(stop=stop)
        stop = orders.stop
        next_check = 0.0
        while not stop.is_set():
            now = self._clock()
            for service in self._services():
                service.poll(now)
            self._reap(now)
            self._check_failed()
            for name in self.supervisor.due(now):
                self._spawn(name, now)
            # Several models: the broker's queues are read every round, so a request for an
            # unloaded model waits one poll interval at most before its load starts.
            if now >= next_check or self.spec.on_demand:
                self._check_ready()
                self._place(now)
                self._follow(orders, now)
                if self._drained(now):
                    break
            if now >= next_check:
                self._publish_view()
                next_check = now + timing.HEARTBEAT_INTERVAL_S / 2
            stop.wait(timing.POLL_INTERVAL_S)

    def view(self) -> dict:
        """Serve's picture of the pool: the endpoint and every supervised worker."""
        loads = {w.get("pid"): w for w in self._registered()}
        workers = []
        for entry in self.supervisor.view():
            registered = loads.get(entry["pid"], {})
            residency = self.loads.describe(entry["name"], self._clock()) if self.spec.on_demand else {}
            workers.append({**entry, **residency, "worker_id": registered.get("id"),
                            "load": registered.get("load")})
        view = {"host": self._host, "endpoint": self.spec.endpoint, "model": self.spec.model,
                "updated": time.time(), "workers": workers, "pid": os.getpid(),
                "draining": self.draining_until is not None,
                "rolling": self.roll.current if self.roll is not None else None}
        for service in self._services():
            view[service.name] = service.describe()
        return view

    def _services(self) -> list[Service]:
        return [s for s in (self._broker, self._http) if s is not None]

    def _check_failed(self) -> None:
        entries = self.supervisor.view()
        if self.keep_up or any(e["state"] != WorkerPhase.FAILING.value for e in entries):
            return
        reasons = "; ".join(f"{e['name']}: {e['reason']}" for e in entries)
        raise ConfigError(f"every worker failed and none will be restarted ({reasons}); "
                          "pass --keep-up-on-worker-failure to keep serve running anyway")

    def _spawn(self, name: str, now: float) -> None:
        old = self._children.pop(name, None)
        if old is not None:
            old.stop()
        model, device = self._workers[name]
        child = ChildProcess(name, self.spec.worker_argv(name, device, model), env=self._env)
        self._children[name] = child.__enter__()
        self.supervisor.started(name, child.pid, now)
        log.info("worker %s started (pid %d)", name, child.pid)

    def _reap(self, now: float) -> None:
        for name, child in list(self._children.items()):
            code = child.poll()
            if code is None:
                continue
            child.stop()
            del self._children[name]
            self._stop_by.pop(name, None)
            planned = self.supervisor.state(name) is WorkerPhase.DRAINING
            state = self.supervisor.exited(name, code, now, child.last_error())
            if planned or state is WorkerPhase.UNLOADED:  # on purpose: no warning
                log.info("worker %s stopped: %s", name, self.supervisor.describe(name)["reason"])
            elif state is WorkerPhase.FAILING:
                log.error("worker %s is failing and will not be restarted: %s", name,
                          self.supervisor.describe(name)["reason"])
            else:
                log.warning("worker %s exited with status %d; restarting in %.1f s", name, code,
                            self.supervisor.restart_at(name) - now)

    def _registered(self) -> list[dict]:
        return [w for w in (self._broker_status or {}).get("workers", []) if w.get("host") == self._host]

    def _check_ready(self) -> None:
        if self._broker is not None and not self._broker.ready:
            return  # no broker to ask (yet): a status call would only wait out its timeout
        self._broker_status = self._status()
        pids = {w.get("pid") for w in self._registered()}
        for name, child in self._children.items():
            if child.pid in pids and self.supervisor.state(name) is WorkerPhase.STARTING:
                self.supervisor.ready(name)
                log.info("worker %s is ready", name)

    def _place(self, now: float) -> None:
        """Residency's round (several models): start, drain and stop workers as it decides."""
        if not self.spec.on_demand:
            return
        registered = {}
        mine = {w.get("pid"): w for w in self._registered()}
        for name, child in self._children.items():
            if child.pid in mine:
                registered[name] = mine[child.pid]
        for name in self.loads.step(now, self._broker_status, registered):
            child = self._children.get(name)
            if child is not None and name not in self._stop_by:
                child.signal(signal.SIGTERM)
                self._stop_by[name] = now + timing.SHUTDOWN_GRACE_S
            self.loads.stopped(name)
        for name, deadline in list(self._stop_by.items()):
            if now >= deadline and name in self._children:
                self._children[name].signal(signal.SIGKILL)

    # -- drains and rolling restarts (serve/drain.py decides) -------------------------------------

    def _follow(self, orders: Orders, now: float) -> None:
        broker_drain = ((self._broker_status or {}).get("draining") or {}).get("pool")
        if self.draining_until is None and (orders.drain.is_set() or broker_drain):
            self._drain_pool(now, broker_drain)
        if orders.roll.is_set():
            orders.roll.clear()
            self._start_roll(orders.restart_file)
        if self.roll is not None and self.draining_until is None:
            self._roll_round(now)
        registered = self._by_pid() if self._broker_status is not None else None
        self._follow_worker_drains(now, registered or {})
        for name in self.drains.due(now, registered):
            self.drains.stopped(name)
            if name in self._children:
                self._children[name].signal(signal.SIGTERM)
                self._term_sent[name] = (self._children[name].pid, now + timing.SHUTDOWN_GRACE_S)
        for name, (pid, deadline) in list(self._term_sent.items()):
            child = self._children.get(name)
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
                 "%s", timeout, "new ones are refused" if self._broker is not None
                 else "the broker gives new ones to the other hosts")
        if self._broker is not None:
            if not started:
                self._ask_broker("", timeout)
            return
        self.supervisor.stop()
        for name in list(self._children):
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
        for name, child in self._children.items():
            entry = registered.get(child.pid)
            if entry is not None and entry.get("draining") and name not in self.drains \
                    and self.supervisor.state(name) is not WorkerPhase.DRAINING:
                self._drain_worker(name, now, "retire", self.shutdown_timeout_s)

    def _drained(self, now: float) -> bool:
        """Whether the pool's drain is over: nothing left at the local broker (a worker host: no
        worker left running), or its time is up (the broker has failed what was left)."""
        if self.draining_until is None:
            return False
        if now >= self.draining_until + timing.HEARTBEAT_INTERVAL_S:
            log.warning("drain: shutdown_timeout_s is over; stopping with what is left")
            return True
        return pool_idle(self._broker_status) if self._broker is not None else not self._children

    def _start_roll(self, restart_file: Path | None) -> None:
        if self.roll is not None:
            log.warning("a rolling restart is under way (at %s); this one is ignored", self.roll.current)
            return
        self._take_settings(restart_file)
        self.roll = Roll(list(self.supervisor.devices))
        log.info("rolling restart of %d worker(s), one at a time", len(self.supervisor.devices))

    def _take_settings(self, restart_file: Path | None) -> None:
        """The --set items `ovpool restart --rolling` left: the restarted workers take them."""
        if restart_file is None or not restart_file.exists():
            return
        try:
            items = [str(i) for i in json.loads(restart_file.read_text())]
            restart_file.unlink()
        except (OSError, ValueError, TypeError) as exc:
            log.error("cannot read the restart's settings in %s: %s; restarting without them",
                      restart_file, exc)
            return
        names = {i.partition("=")[0] for i in items}
        kept = tuple(a for a in self.spec.assignments if a.partition("=")[0] not in names)
        self.spec = dataclasses.replace(self.spec, assignments=kept + tuple(items))
        log.info("the restarted workers take %s", ", ".join(items))

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
            self._broker_status = self._broker_drain(worker, timeout_s) or self._broker_status
        except Exception as exc:  # the broker is down: the drain goes on by the deadline alone
            log.warning("could not ask the broker to drain %s: %s", worker or "the pool", exc)

    def _by_pid(self) -> dict[int, dict]:
        return {w.get("pid"): w for w in self._registered()}

    def _publish_view(self) -> None:
        try:
            self._publish(self.view())
        except Exception:  # publishing is best effort; supervision must go on
            log.exception("could not publish the pool state")
