"""The broker's routing core against hostile peers: what one client or worker may make it hold
is bounded, and every SUBMIT it cannot take is answered with an ERROR naming the field."""

from __future__ import annotations

import pytest
from broker_helpers import C1, LATE, W1, W2, of, one_worker_router, ready, submit

from ovpool import bounds, errors, timing
from ovpool.broker import bounds as peer_bounds
from ovpool.broker.router import Router
from ovpool.broker.state import LOAD_FAILED_EXPIRY_S
from ovpool.protocol import (
    Cancel,
    Credit,
    Error,
    Final,
    Heartbeat,
    LoadFailed,
    Partial,
    Ping,
    Pong,
    Ready,
    Request,
    Submit,
    Supervised,
)

router = pytest.fixture(one_worker_router, name="router")


def test_a_client_granting_itself_huge_credit_gets_no_more_than_its_window(router):
    (w, _), = router.handle(C1, submit("r", window=2, max_tokens=8), LATE)
    sent = [router.handle(w, Partial("r", i, i, "x", i), LATE) for i in range(2)]
    assert all(len(of(out, Partial)) == 1 for out in sent)
    router.handle(C1, Credit("r", 10**9), LATE)  # it cannot have read more than the 2 it got
    forwarded = [m for i in range(2, 8)
                 for _, m in of(router.handle(w, Partial("r", i, i, "x", i), LATE), Partial)]
    assert [m.seq for m in forwarded] == [2, 3]
    assert router.status(LATE)["streams"] == {"open": 1, "held": 4}


def test_a_window_is_never_wider_than_the_requests_max_tokens(router):
    (w, _), = router.handle(C1, submit("r", window=10**9, max_tokens=3), LATE)
    out = [m for i in range(6) for _, m in router.handle(w, Partial("r", i, i, "x", i), LATE)]
    # A worker sending more PARTIALs than max_tokens lies: the extra ones are dropped and counted.
    assert [m.seq for m in out if isinstance(m, Partial)] == [0, 1, 2]
    assert router.counters.malformed == 3 and router.status(LATE)["streams"]["held"] == 0


def test_a_lying_client_leaves_the_broker_holding_a_bounded_number_of_tokens():
    """Measured: a client that opens each stream with a small window, grants itself 10**9 credit
    at once and reads nothing, for 5 simulated minutes of a 4-slot worker generating as fast as
    it can: what waits in the broker stays under (streams alive within stream_stall_s) x
    max_tokens, and what it was sent under two windows a stream (the window, then one refill).
    The broker's send queue to it is bounded by the socket's high-water mark (broker/server.py)."""
    stall_s, max_tokens, window = 5.0, 64, 8
    r = Router(now=0.0, queue_limit=4, max_new_tokens=max_tokens, stream_stall_s=stall_s)
    r.handle(W1, ready(slots=4), LATE)
    now, ids, sent, most_held, streams = LATE, 0, 0, 0, 0
    while now < LATE + 300:
        for _ in range(4 - len(r.workers[W1].inflight)):  # keep every slot busy
            r.handle(C1, Submit(f"h{ids}", "m", {"max_tokens": max_tokens}, prompt="x", window=window), now)
            sent += len(of(r.handle(C1, Credit(f"h{ids}", 10**9), now), Partial))
            ids, streams = ids + 1, streams + 1
        for rid in list(r.workers[W1].inflight):
            job = r.jobs[rid]
            seq = job.next_seq
            msg = Partial(rid, seq, seq, "x", seq) if seq < max_tokens else Final(rid, {}, seq)
            sent += len([1 for peer, m in r.handle(W1, msg, now) if peer == C1 and isinstance(m, Partial)])
        r.handle(C1, Ping([]), now)
        r.handle(W1, Heartbeat(), now)
        r.tick(now)
        most_held = max(most_held, r.streams.held())
        now += 0.01
    alive = 4 * (stall_s / 0.64 + 2)  # streams finish every 0.64 s per slot and live stall_s more
    assert most_held <= alive * max_tokens
    assert sent <= streams * window * 2 and streams > 1000  # at most window, then a refill
    assert r.counters.cancelled > 0  # unread streams end with ClientTooSlowError


def test_a_worker_advertising_a_billion_slots_fills_at_most_max_slots():
    r = Router(now=0.0, queue_limit=2000)
    r.handle(W1, ready(slots=8), LATE)
    r.handle(W2, ready(slots=10**9, worker_id="liar"), LATE)
    peers = [peer for i in range(1100) for peer, _ in of(r.handle(C1, submit(f"r{i}"), LATE), Request)]
    assert peers.count(W2) == peer_bounds.MAX_SLOTS and peers.count(W1) == 8
    assert r.status(LATE)["workers"][1]["slots"] == peer_bounds.MAX_SLOTS


def load_failed(worker_id="CPU@h:9", models=("smollm2",), message="architecture 'mamba' is not supported"):
    return LoadFailed(worker_id, list(models), "CPU", "h", 9, errors.UnsupportedModelError.code, message)


def test_a_load_failure_expires_so_a_forged_one_stops_failing_requests():
    r = Router(now=0.0)
    r.handle(b"forger", load_failed(message="x" * 100_000), LATE)
    (_, err), = r.handle(C1, submit("a", model="smollm2"), LATE + 1)
    assert err.code == errors.ModelNotFoundError.code and len(err.message) < 1200  # its text is cut
    r.tick(LATE + LOAD_FAILED_EXPIRY_S)
    assert r.status(LATE + LOAD_FAILED_EXPIRY_S)["failed"] == []
    (_, err), = r.handle(C1, submit("b", model="smollm2"), LATE + LOAD_FAILED_EXPIRY_S)
    assert "failed" not in err.message


def test_a_load_failure_lasts_while_serve_reports_the_worker_failing():
    r = Router(now=0.0)
    r.handle(b"w", load_failed(), LATE)
    for t in range(0, int(LOAD_FAILED_EXPIRY_S * 3), 3):
        r.handle(C1, Supervised("h", 10, [{"name": "CPU", "state": "failing", "reason": "exit 3"}]), LATE + t)
        r.tick(LATE + t)
    assert [f["id"] for f in r.status(LATE + t)["failed"]] == ["CPU@h:9"]


def test_a_ready_for_the_model_clears_its_load_failures():
    r = Router(now=0.0)
    r.handle(b"w", load_failed(worker_id="GPU@h:9"), LATE)
    r.handle(W1, Ready("CPU@other:1", ["smollm2"], "CPU", 2, "other", 1), LATE + 1)  # another worker
    assert r.status(LATE + 1)["failed"] == []
    assert of(r.handle(C1, submit("a", model="smollm2"), LATE + 1), Request)


@pytest.mark.parametrize("msg", [
    ready(models=["m" * 257]),
    ready(models=[f"m{i}" for i in range(peer_bounds.MAX_NAMES + 1)]),
    ready(worker_id=""),
    ready(load={"outcome": "x" * (peer_bounds.MAX_REPORT_SIZE + 1)}),
    ready(load={"seconds": float("nan")}),
    ready(slots=0),
    load_failed(models=[["not", "a", "name"]]),
    load_failed(models=[]),
    Supervised("h", 1, [{"name": "CPU", "pid": [1]}]),  # unhashable: metrics count by (host, pid)
    Supervised("h", 1, [{"name": "x" * (peer_bounds.MAX_REPORT_SIZE + 1)}]),
    Supervised("h" * 300, 1, []),
])
def test_reports_over_the_limits_are_dropped_and_counted(router, msg):
    before = router.status(LATE)
    router.handle(W2, msg, LATE)
    after = router.status(LATE)
    assert after["counters"]["malformed"] == before["counters"]["malformed"] + 1
    assert (after["workers"], after["failed"], after["supervised"]) == \
        (before["workers"], before["failed"], before["supervised"])


def test_at_most_max_workers_register():
    r = Router(now=0.0)
    for i in range(peer_bounds.MAX_WORKERS + 5):
        r.handle(b"w%d" % i, ready(worker_id=f"w{i}"), LATE)
    assert len(r.workers) == peer_bounds.MAX_WORKERS and r.counters.malformed == 5


def test_a_restarted_broker_waits_for_a_bounded_number_of_unknown_models():
    r = Router(now=0.0)
    from ovpool.broker.admission import MAX_UNSEEN_MODELS

    answers = [r.handle(C1, submit(f"r{i}", model=f"m{i}"), 1.0) for i in range(MAX_UNSEEN_MODELS + 50)]
    assert all(a == [] for a in answers[:MAX_UNSEEN_MODELS])
    assert all(a[0][1].code == errors.ModelNotFoundError.code for a in answers[MAX_UNSEEN_MODELS:])
    r.tick(timing.BROKER_GRACE_S + 1.0)  # no worker came: they fail, and their queues go
    assert r.status(timing.BROKER_GRACE_S + 1.0)["queues"] == {}


def test_ping_with_ids_that_are_not_strings_is_answered(router):
    assert router.handle(C1, Ping(["r", [1], {"a": 1}, 7]), LATE) == [(C1, Pong(["r"]))]


def _deep(levels):
    value = {"type": "string"}
    for _ in range(levels):
        value = {"type": "object", "properties": {"a": value}}
    return value


@pytest.mark.parametrize("msg, field", [
    (Submit("r", "m", {"response_format": {"type": "json_schema", "schema": {"type": b"string"}}},
            prompt="p"), "response_format"),
    (Submit("r", "m", {"response_format": {"type": "json_schema", "schema": _deep(100)}}, prompt="p"),
     "response_format"),
    (Submit("r", "m", {"response_format": {"type": ["json_schema"]}}, prompt="p"), "response_format"),
    (Submit("r", "m", {"stop": ["x"] * (bounds.MAX_STOP + 1)}, prompt="p"), "stop"),
    (Submit("r", "m", {}, prompt="x" * (bounds.MAX_PROMPT_CHARS + 1)), "prompt"),
    (Submit("r", "m", {}, messages=[{"role": "user", "content": "x"}] * (bounds.MAX_MESSAGES + 1)),
     "messages"),
    (Submit("r", "m", {}, messages=[{"role": "user", "content": "x", "name": b"n"}]), "messages[0].name"),
    (Submit("r", "m", {}, messages=[{"role": "user", "content": "x", "tool": {"a": b"x"}}]), "messages[0]"),
    (Submit("r", "m" * 300, {}, prompt="p"), "model"),
    (Submit("r", "m", {}, prompt="p", timeout_s=float("nan")), "timeout_s"),
    (Submit("r", "m", {}, prompt="p", window=-1), "window"),
])
def test_every_submit_the_broker_cannot_take_is_answered_naming_the_field(router, msg, field):
    (peer, err), = router.handle(C1, msg, LATE)
    assert peer == C1 and isinstance(err, Error) and err.request_id == "r"
    assert err.code == errors.InvalidRequestError.code and field in err.message
    assert of(router.handle(C1, submit("next"), LATE), Request)  # and the next one is served


def test_a_request_that_keeps_losing_its_worker_fails_saying_why(router):
    router.handle(C1, submit("r"), LATE)
    now, out = LATE, []
    for _ in range(3):
        now += timing.HEARTBEAT_EXPIRY_S + 0.01
        out = router.tick(now) + router.handle(W1, ready(), now)
    (_, err), = of(out, Error)
    assert err.code == errors.WorkerLostError.code
    assert "lost its worker 3 times" in err.message and "too expensive" in err.message
    assert (W1, Cancel("r")) not in out


def test_a_validator_failing_on_input_it_never_expected_fails_that_request_alone(router, monkeypatch):
    def choke(params):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr("ovpool.broker.admission.sampling_from_wire", choke)
    (peer, err), = router.handle(C1, submit("r"), LATE)
    assert peer == C1 and err.code == errors.InvalidRequestError.code
    assert err.message == ("params: not valid sampling parameters"
                           " (RecursionError: maximum recursion depth exceeded)")
