"""Serve's drains and rolling restarts as pure logic (serve/drain.py, the supervisor's planned
exits, the probe): phases and statuses in, decisions out; no processes."""

from __future__ import annotations

import time

from ovpool.serve import state
from ovpool.serve.drain import Drains, Roll, pool_idle
from ovpool.serve.supervisor import RestartPolicy, Supervisor, WorkerPhase

READY, STARTING, BACKOFF, FAILING = (WorkerPhase.READY, WorkerPhase.STARTING, WorkerPhase.BACKOFF,
                                     WorkerPhase.FAILING)


def _ready_sup(*names: str) -> Supervisor:
    sup = Supervisor({n: "CPU" for n in names}, RestartPolicy(backoff_min_s=1.0, stable_after_s=60.0))
    for i, name in enumerate(names):
        sup.started(name, 100 + i, 0.0)
        sup.ready(name)
    return sup


def test_a_drained_worker_is_restarted_at_once_and_its_exit_is_no_failure():
    sup = _ready_sup("w0")
    sup.draining("w0", "restart")
    assert sup.describe("w0")["state"] == "draining"
    assert sup.exited("w0", 0, 5.0) is BACKOFF and sup.due(5.0) == ["w0"]  # no backoff delay
    sup.started("w0", 200, 5.0)
    assert sup.describe("w0")["restarts"] == 1
    # A fast exit right after (a bad new binary) is a failure like any other.
    assert sup.exited("w0", 1, 5.5) is BACKOFF and sup.due(5.5) == []


def test_a_retired_worker_stays_stopped_and_a_revived_one_starts_now():
    sup = _ready_sup("w0", "w1")
    sup.draining("w1", "retire")
    assert sup.exited("w1", 0, 3.0) is WorkerPhase.STOPPED
    assert sup.describe("w1")["reason"] == "drained" and sup.due(1e9) == []
    sup.revive("w1", 4.0)
    assert sup.due(4.0) == ["w1"]


def test_drained_workers_stop_once_idle_at_the_broker_or_at_their_deadline():
    drains = Drains()
    drains.begin("busy", 11, 0.0, 10.0)
    drains.begin("idle", 12, 0.0, 10.0)
    drains.begin("gone", 13, 0.0, 10.0)
    registered = {11: {"draining": True, "active": 2}, 12: {"draining": True, "active": 0}}
    assert drains.due(1.0, registered) == ["idle", "gone"]  # "gone": not registered at all
    assert drains.due(1.0, {12: {"draining": False, "active": 0}}) == ["busy", "gone"]  # drain not seen yet
    assert drains.due(1.0, None) == []  # no status from the broker: only the deadline counts
    assert drains.due(10.0, None) == ["busy", "idle", "gone"]
    drains.stopped("busy")
    assert "busy" not in drains and "idle" in drains


def test_a_pool_is_idle_once_nothing_runs_waits_or_streams():
    assert pool_idle({"in_flight": 0, "queues": {"m": 0}, "streams": {"open": 0}})
    assert not pool_idle({"in_flight": 1, "queues": {}, "streams": {"open": 0}})
    assert not pool_idle({"in_flight": 0, "queues": {"m": 2}, "streams": {"open": 0}})
    assert not pool_idle({"in_flight": 0, "queues": {}, "streams": {"open": 1}})
    assert not pool_idle(None)


def test_a_roll_replaces_one_worker_at_a_time_in_order():
    roll = Roll(["a", "b"])
    phases = {"a": (READY, 1), "b": (READY, 2)}
    assert roll.step(phases) == [("drain", "a")]
    for a in [(WorkerPhase.DRAINING, 1), (BACKOFF, None), (STARTING, 3), (READY, 1)]:
        assert roll.step({**phases, "a": a}) == []  # b waits until a is ready as a new process
    phases["a"] = (READY, 3)
    assert roll.step(phases) == [("drain", "b")]
    phases["b"] = (READY, 4)
    assert roll.step(phases) == [("done", "")] and roll.current is None


def test_a_roll_revives_a_worker_without_a_process_and_stops_at_a_failed_start():
    roll = Roll(["a", "b", "c"])
    phases = {"a": (FAILING, None), "b": (READY, 2), "c": (READY, 3)}
    assert roll.step(phases) == [("revive", "a")]
    phases["a"] = (READY, 5)
    assert roll.step(phases) == [("drain", "b")]
    phases["b"] = (FAILING, None)  # its new process failed: c keeps its old one
    assert roll.step(phases) == [("failed", "b")]


def test_the_ready_probe_fails_while_serve_drains():
    view = {"updated": time.time(), "workers": [{"state": "ready"}], "draining": True}
    assert state.check(view, need_ready=True) == (False, "draining (1 ready)")
    assert state.check(view, need_ready=False)[0]  # alive: liveness must not restart it mid-drain
