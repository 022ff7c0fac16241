"""DRAIN in the broker's routing core: a draining pool refuses new requests at once (retryable) and
fails what is unfinished at its deadline; a draining worker gets nothing new and hands back the rest."""

from __future__ import annotations

import pytest
from broker_helpers import C1, C2, LATE, W1, W2, of, one_worker_router, ready, submit

from ovpool import errors
from ovpool.protocol import Disconnect, Drain, Error, Final, Partial, Request, StatusReply

router = pytest.fixture(one_worker_router, name="router")


def test_a_pool_drain_refuses_new_requests_and_lets_accepted_ones_finish(router):
    router.handle(C1, submit("run", window=8), LATE)
    router.handle(C1, submit("wait1"), LATE)
    router.handle(C1, submit("wait2"), LATE)  # W1 has 2 slots: this one is queued
    (peer, reply), = router.handle(C2, Drain("", 10.0), LATE)
    assert peer == C2 and isinstance(reply, StatusReply)
    assert reply.status["draining"]["pool"]["deadline_in_s"] == 10.0
    (peer, err), = router.handle(C2, submit("new"), LATE + 1)
    assert peer == C2 and err.code == errors.DrainingError.code and "draining" in err.message
    assert of(router.handle(W1, Partial("run", 0, 1, "x", 0), LATE + 1), Partial) == [
        (C1, Partial("run", 0, 1, "x", 0))]
    out = router.handle(W1, Final("wait1", {}), LATE + 2)
    assert of(out, Final) == [(C1, Final("wait1", {}))]
    assert [m.request_id for _, m in of(out, Request)] == ["wait2"]  # the queue still runs


def test_what_is_unfinished_at_the_drain_deadline_fails_with_a_clear_error(router):
    router.handle(C1, submit("run"), LATE)
    router.handle(C1, submit("also"), LATE)
    router.handle(C1, submit("queued"), LATE)
    router.handle(C2, Drain("", 5.0), LATE)
    assert of(router.tick(LATE + 4.9), Error) == []
    failed = of(router.tick(LATE + 5.0), Error)
    assert sorted(m.request_id for _, m in failed) == ["also", "queued", "run"]
    assert {m.code for _, m in failed} == {errors.DrainingError.code}
    assert "shutdown_timeout_s" in failed[0][1].message and "5 s" in failed[0][1].message
    assert router.status(LATE + 5)["in_flight"] == 0 and not router.jobs


def test_a_second_drain_brings_the_deadline_nearer_never_further(router):
    router.handle(C1, Drain("", 30.0), LATE)
    (_, reply), = router.handle(C1, Drain("", 60.0), LATE + 1)
    assert reply.status["draining"]["pool"]["deadline_in_s"] == 29.0
    (_, reply), = router.handle(C1, Drain("", 0.0), LATE + 2)
    assert reply.status["draining"]["pool"]["deadline_in_s"] == 0.0


def test_a_drained_worker_gets_nothing_new_and_its_handed_back_requests_move_once():
    r = one_worker_router()
    r.handle(W2, ready(slots=2, worker_id="CPU#1@h:2"), LATE)
    r.handle(C1, submit("a", window=8), LATE)  # both idle: the first registered, W1
    assert of(r.handle(C1, submit("b", window=8), LATE), Request)[0][0] == W2
    (_, reply), = r.handle(C2, Drain("CPU#1", 30.0), LATE)
    assert reply.status["draining"] == {"pool": None, "workers": ["CPU#1@h:2"]}
    assert [w["draining"] for w in reply.status["workers"]] == [False, True]
    assert of(r.handle(C1, submit("c"), LATE), Request)[0][0] == W1
    assert of(r.handle(C1, submit("d"), LATE), Request) == []  # W1 full, W2 draining: it waits
    # The drained worker leaves before "b" finished: "b" goes first to the next free slot.
    assert of(r.handle(W2, Disconnect(["b"]), LATE + 1), Request) == []
    out = r.handle(W1, Final("c", {}), LATE + 2)
    assert [(p, m.request_id) for p, m in of(out, Request)] == [(W1, "b")]
    assert r.jobs["b"].attempts == 1  # handed back: that dispatch is not counted as a failure


def test_a_drain_that_names_no_worker_drains_none_and_says_so(router):
    (_, reply), = router.handle(C1, Drain("GPU.7", 30.0), LATE)
    assert reply.status["draining"] == {"pool": None, "workers": []}
    assert of(router.handle(C1, submit("x"), LATE), Request) != []
