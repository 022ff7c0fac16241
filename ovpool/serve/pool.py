"""The process layer of ``ovpool serve``: starts the children, feeds the Supervisor, publishes its view.

``Pool`` owns the broker and HTTP API services (ovpool.serve.service; no broker when it joins a
remote one) and one ChildProcess per worker. Readiness comes from the broker itself: a worker is
ready once the broker's status lists a worker with its host and pid, which is the only readiness a
client cares about. The supervisor's view (including workers that never registered) goes to
``publish`` once per interval. Once every worker has failed for good serve ends (ConfigError)
unless ``keep_up``: a pool that can never serve should not look alive.
Serve's drains and rolling restarts (``Orders``) go through its Conductor (serve/conductor.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable

from ovpool import timing
from ovpool.errors import ConfigError
from ovpool.serve.child import ChildProcess
from ovpool.serve.conductor import BrokerDrainFn, Conductor, Orders
from ovpool.serve.loads import DrainFn, ModelLoads
from ovpool.serve.memory import MemoryReader
from ovpool.serve.service import Service
from ovpool.serve.spare import SpareWorker, spare_due
from ovpool.serve.spec import PoolSpec
from ovpool.serve.supervisor import RestartPolicy, Supervisor, WorkerPhase

log = logging.getLogger(__name__)

StatusFn = Callable[[], "dict | None"]
PublishFn = Callable[[dict], None]
__all__ = ["Orders", "Pool"]


class Pool:
    """``with Pool(spec, status, publish) as pool: pool.run(stop_event)``; leaving stops every child."""

    def __init__(self, spec: PoolSpec, status: StatusFn, publish: PublishFn,
                 env: dict[str, str] | None = None, policy: RestartPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic, http_env: dict[str, str] | None = None,
                 broker_env: dict[str, str] | None = None, keep_up: bool = False,
                 drain: DrainFn | None = None, broker_drain: BrokerDrainFn | None = None,
                 shutdown_timeout_s: float = 30.0):
        self.spec, self.keep_up = spec, keep_up
        self._status, self._publish, self._env, self._clock = status, publish, env, clock
        self._workers = spec.workers()
        policy = policy or RestartPolicy()
        self.supervisor = Supervisor({n: d for n, (_, d) in self._workers.items()}, policy,
                                     unloaded=frozenset(self._workers) if spec.on_demand else frozenset())
        self.loads = ModelLoads(spec, self.supervisor, drain)
        self._memory = MemoryReader()
        self._spare = SpareWorker(spec.python, env) if spec.on_demand and spec.spare_worker else None
        self._spawned_at = float("-inf")  # the latest worker start
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
        self.conductor = Conductor(self.supervisor, self._children, host=self._host,
                                   local_broker=self._broker is not None, broker_drain=broker_drain,
                                   shutdown_timeout_s=shutdown_timeout_s, take_settings=self._take_settings)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._http is not None:  # first: no new requests while the workers drain
            self._http.stop()
        if self._spare is not None:
            self._spare.close()
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
            # Several models: the broker's queues are read every round, so a request for an
            # unloaded model waits one poll interval at most before its load starts; a signal's
            # order is followed in the round it arrives (readiness turns 503 within ~0.1 s).
            if now >= next_check or self.spec.on_demand or orders.drain.is_set() or orders.roll.is_set():
                self._check_ready()
                self._place(now)
                self._broker_status = self.conductor.follow(orders, now, self._broker_status)
                if self.conductor.drained(now):
                    break
            # After placement: a load it decided starts in this round, not the next.
            for name in self.supervisor.due(now):
                self._spawn(name, now)
            self._keep_spare(now)
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
                "updated": time.time(), "workers": workers, "pid": os.getpid(), **self.conductor.describe(),
                "spare_pid": self._spare.pid if self._spare is not None else None}
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
        argv = self.spec.worker_argv(name, device, model)
        child = self._spare.take(name, argv) if self._spare is not None else None
        self._children[name] = child or ChildProcess(name, argv, env=self._env).__enter__()
        self.supervisor.started(name, self._children[name].pid, now)
        self._spawned_at = now
        log.info("worker %s started (pid %d%s)", name, self._children[name].pid,
                 ", the spare process" if child else "")

    def _keep_spare(self, now: float) -> None:
        """A spare worker process for the next load, started once no worker has started lately and
        nothing runs (both would share the cores: spare_due), and the pool is not stopping."""
        if self._spare is not None and spare_due(now - self._spawned_at, self._broker_status) \
                and self.conductor.draining_until is None:
            self._spare.keep_one(self.loads.likely_next())

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
        memory = self._memory.read(now, {name: child.pid for name, child in self._children.items()})
        stopped = self._stop_idle(now, self.loads.step(now, self._broker_status, registered, memory))
        if stopped:  # the load they made room for starts in this round, not a poll interval later
            self._stop_idle(now, self.loads.step(now, self._broker_status, registered))
        for name, deadline in list(self._stop_by.items()):
            if now >= deadline and name in self._children:
                self._children[name].signal(signal.SIGKILL)

    def _stop_idle(self, now: float, names: list[str]) -> list[str]:
        """Signal the drained, idle workers ``names`` to exit; returns them."""
        for name in names:
            child = self._children.get(name)
            if child is not None and name not in self._stop_by:
                child.signal(signal.SIGTERM)
                child.yield_cpu()  # its exit may wait for set-up it still runs: off the new load's cores
                self._stop_by[name] = now + timing.SHUTDOWN_GRACE_S
            self.loads.stopped(name)
        return names

    def _take_settings(self, items: tuple[str, ...]) -> None:
        """A rolling restart's --set items: each replaces the same setting of serve's own."""
        names = {i.partition("=")[0] for i in items}
        kept = tuple(a for a in self.spec.assignments if a.partition("=")[0] not in names)
        self.spec = dataclasses.replace(self.spec, assignments=kept + items)

    def _publish_view(self) -> None:
        try:
            self._publish(self.view())
        except Exception:  # publishing is best effort; supervision must go on
            log.exception("could not publish the pool state")
