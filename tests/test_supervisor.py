"""The restart policy, driven by events and fake times: no processes, no sleeping."""

from __future__ import annotations

import pytest

from ovpool.errors import EXIT_PERMANENT
from ovpool.serve.supervisor import RestartPolicy, Supervisor, WorkerPhase

POLICY = RestartPolicy(backoff_min_s=1.0, backoff_max_s=8.0, stable_after_s=60.0, give_up_after=5)


def _sup(*names: str) -> Supervisor:
    return Supervisor({n: "CPU" for n in names}, POLICY)


def _run(sup: Supervisor, name: str, start: float, pid: int = 100) -> None:
    assert name in sup.due(start)
    sup.started(name, pid, start)


def test_every_worker_starts_at_once_and_only_once():
    sup = _sup("w0", "w1", "w2")
    assert sorted(sup.due(0.0)) == ["w0", "w1", "w2"]
    for i, name in enumerate(("w0", "w1", "w2")):
        sup.started(name, 100 + i, 0.0)
    assert sup.due(1000.0) == []
    assert {v["state"] for v in sup.view()} == {"starting"}


def test_crash_after_a_stable_run_restarts_after_the_minimum_delay():
    sup = _sup("w0")
    _run(sup, "w0", 0.0)
    sup.ready("w0")
    assert sup.exited("w0", -9, 500.0) is WorkerPhase.BACKOFF
    assert sup.due(500.5) == []
    assert sup.next_due() == pytest.approx(501.0)
    _run(sup, "w0", 501.0, pid=101)
    view = sup.view()[0]
    assert view["restarts"] == 1 and view["last_exit"] == -9 and view["pid"] == 101


def test_fast_failures_back_off_exponentially_up_to_the_cap():
    sup = _sup("w0")
    now, delays = 0.0, []
    _run(sup, "w0", now)
    for _ in range(4):
        sup.exited("w0", 2, now + 0.1)
        delays.append(sup.next_due() - (now + 0.1))
        now = sup.next_due()
        _run(sup, "w0", now)
    assert delays == [1.0, 2.0, 4.0, 8.0]
    capped = RestartPolicy(backoff_min_s=1.0, backoff_max_s=8.0).delay(10)
    assert capped == 8.0


def test_gives_up_after_k_fast_failures_and_reports_the_reason():
    sup = _sup("w0", "w1")
    sup.started("w1", 200, 0.0)
    now = 0.0
    for _ in range(POLICY.give_up_after):
        _run(sup, "w0", now)
        state = sup.exited("w0", 2, now + 0.5, reason="error: model cache MISS fam: ov version differs")
        now = sup.next_due() or now
    assert state is WorkerPhase.FAILING
    assert sup.due(10_000.0) == []
    view = {v["name"]: v for v in sup.view()}
    assert view["w0"]["state"] == "failing"
    assert "cache MISS" in view["w0"]["reason"] and "5 failed starts" in view["w0"]["reason"]
    assert view["w1"]["state"] == "starting"


def test_a_permanent_error_at_start_is_failing_at_once_but_a_crash_is_retried():
    sup = _sup("w0", "w1")
    _run(sup, "w0", 0.0)
    reason = "error: architecture 'gemma9' is not supported"
    assert sup.exited("w0", EXIT_PERMANENT, 0.5, reason=reason) is WorkerPhase.FAILING
    assert sup.due(10_000.0) == ["w1"]  # never restarted
    view = sup.describe("w0")
    assert view["reason"].startswith(reason) and "not retried" in view["reason"]
    _run(sup, "w1", 0.0, pid=200)  # the same status from a worker that was ready: a crash
    sup.ready("w1")
    assert sup.exited("w1", EXIT_PERMANENT, 500.0) is WorkerPhase.BACKOFF
    _run(sup, "w1", 501.0, pid=201)
    assert sup.exited("w1", -9, 501.5) is WorkerPhase.BACKOFF  # killed at start: retried as before


def test_a_stable_run_resets_the_fast_failure_count():
    sup = _sup("w0")
    now = 0.0
    for _ in range(POLICY.give_up_after - 1):
        _run(sup, "w0", now)
        sup.exited("w0", 1, now + 0.1)
        now = sup.next_due()
    _run(sup, "w0", now)
    sup.ready("w0")
    sup.exited("w0", -9, now + 120.0)  # stable: ready and ran past stable_after_s
    assert sup.next_due() == pytest.approx(now + 121.0)
    _run(sup, "w0", now + 121.0)
    assert sup.exited("w0", 1, now + 121.5) is WorkerPhase.BACKOFF


def test_exit_soon_after_ready_still_counts_as_fast():
    sup = _sup("w0")
    _run(sup, "w0", 0.0)
    sup.ready("w0")
    sup.exited("w0", 1, 5.0)
    _run(sup, "w0", sup.next_due())
    sup.exited("w0", 1, 6.5)
    assert sup.next_due() == pytest.approx(6.5 + 2.0)


def test_exits_during_shutdown_are_not_restarted():
    sup = _sup("w0", "w1")
    for n in ("w0", "w1"):
        _run(sup, n, 0.0)
    sup.stop()
    assert sup.exited("w0", 0, 1.0) is WorkerPhase.STOPPED
    assert sup.due(100.0) == [] and sup.next_due() is None
    assert sup.state("w1") is WorkerPhase.STARTING


def test_ready_is_ignored_unless_starting():
    sup = _sup("w0")
    sup.ready("w0")
    assert sup.state("w0") is WorkerPhase.BACKOFF
