"""The broker's routing core, driven by hand: messages in, (peer, message) out, time as a number."""

from __future__ import annotations

import pytest
from broker_helpers import C1, C2, LATE, W1, W2, of, one_worker_router, ready, submit

from ovpool import errors, timing
from ovpool.broker.router import Router
from ovpool.protocol import (
    WORKER_WINDOW,
    Cancel,
    Credit,
    Disconnect,
    Error,
    Final,
    Heartbeat,
    LoadFailed,
    Partial,
    Ping,
    Pong,
    Ready,
    Request,
    Shutdown,
    Status,
    StatusReply,
    Submit,
    Supervised,
)

router = pytest.fixture(one_worker_router, name="router")


def test_requests_go_to_the_least_loaded_worker_with_a_free_slot(router):
    router.handle(W2, ready(slots=4), LATE)
    peers = [of(router.handle(C1, submit(f"r{i}"), LATE), Request)[0][0] for i in range(6)]
    # W1 has 2 slots, W2 has 4: the ratio of busy slots decides, never more than the slots.
    assert peers.count(W1) == 2 and peers.count(W2) == 4
    assert of(router.handle(C1, submit("r6"), LATE), Request) == []
    assert router.status(LATE)["queues"] == {"m": 1}


def test_queue_is_fifo_bounded_and_overflow_is_rejected_at_once(router):
    for i in range(4):  # 2 run, 2 wait
        router.handle(C1, submit(f"r{i}"), LATE)
    (peer, err), = router.handle(C1, submit("r4"), LATE)
    assert peer == C1 and err.code == errors.QueueFullError.code and "queue_limit" in err.message
    out = router.handle(W1, Final("r0", {}), LATE)
    assert of(out, Final) == [(C1, Final("r0", {}))]
    assert [m.request_id for _, m in of(out, Request)] == ["r2"]


def test_unknown_model_fails_at_once_after_the_grace_but_waits_during_it():
    r = Router(now=0.0)
    (_, err), = r.handle(C1, submit("a", model="nope"), timing.BROKER_GRACE_S + 1)
    assert err.code == errors.ModelNotFoundError.code and "'nope'" in err.message
    r = Router(now=0.0)
    assert r.handle(C1, submit("b", model="later"), 0.1) == []  # a restarted broker's workers re-register
    out = r.handle(W1, ready(models=("later",)), 0.2)
    assert [m.request_id for _, m in of(out, Request)] == ["b"]


def test_unnamed_model_is_the_only_one_served_and_ambiguity_is_an_error(router):
    router.handle(W1, ready(models=("m", "m-alias")), LATE)  # other names of one model are aliases
    assert of(router.handle(C1, submit("a", model=""), LATE), Request)[0][1].model == "m"
    assert of(router.handle(C1, submit("a2", model="m-alias"), LATE), Request)[0][1].model == "m-alias"
    router.handle(W2, ready(models=("other",)), LATE)
    (_, err), = router.handle(C1, submit("b", model=""), LATE)
    assert err.code == errors.InvalidRequestError.code and "name a model" in err.message


@pytest.mark.parametrize("bad, why", [
    (submit("x", max_tokens=101), "max_new_tokens"),
    (submit("x", temperature="hot"), "temperature"),
    (submit("x", seed=-1), "seed"),
    (Submit("x", "m", {}, prompt=None), "prompt or messages"),
    (Submit("x", "m", {}, messages=[{"role": 1}]), "messages"),
    (Submit("", "m", {}, prompt="p"), "request_id"),
])
def test_invalid_requests_are_answered_with_a_clear_error(router, bad, why):
    (peer, err), = router.handle(C1, bad, LATE)
    assert peer == C1 and err.code == errors.InvalidRequestError.code and why in err.message


def test_seedless_requests_get_a_seed_so_a_replay_repeats_the_tokens(router):
    (_, req), = router.handle(C1, submit("r", seed=None), LATE)
    assert isinstance(req.params["seed"], int)


def test_each_token_index_reaches_the_client_once_across_a_re_dispatch(router):
    router.handle(W2, ready(), LATE)
    (w, _), = router.handle(C1, submit("r", window=8), LATE)
    other = W2 if w == W1 else W1
    assert of(router.handle(w, Partial("r", 0, 7, "a", 0), LATE), Partial)
    assert of(router.handle(w, Partial("r", 1, 8, "b", 1), LATE), Partial)
    router.handle(other, Heartbeat(), LATE + 0.02)
    out = router.tick(LATE + timing.HEARTBEAT_EXPIRY_S + 0.01)  # w goes silent: expired
    assert of(out, Request) == [(other, Request("r", "m", out[-1][1].params, "hi", None))]
    assert router.handle(other, Partial("r", 0, 7, "a", 0), LATE + 1) == []
    assert router.handle(other, Partial("r", 1, 8, "b", 1), LATE + 1) == []
    fresh = Partial("r", 2, 9, "c", 2)
    assert of(router.handle(other, fresh, LATE + 1), Partial) == [(C1, fresh)]


def test_attempts_are_bounded_then_worker_lost(router):
    router.handle(C1, submit("r"), LATE)
    now = LATE
    for attempt in range(2, 5):  # attempt 1 was dispatched at submit
        now += timing.HEARTBEAT_EXPIRY_S + 0.01
        out = router.tick(now)
        out += router.handle(W1, ready(), now)
        if attempt <= 3:
            assert of(out, Request), f"attempt {attempt} should be dispatched"
    lost = of(out, Error)
    assert lost and lost[0][0] == C1 and lost[0][1].code == errors.WorkerLostError.code


def test_disconnect_hands_requests_back_without_costing_an_attempt(router):
    router.handle(C1, submit("r"), LATE)
    for _ in range(5):
        out = router.handle(W1, Disconnect(["r"]), LATE)
        out = router.handle(W1, ready(), LATE)
        assert of(out, Request)
    assert router.counters.requeued == 5 and router.counters.failed == 0


def test_cancel_reaches_the_worker_and_frees_its_slot_at_once(router):
    router.handle(C1, submit("a"), LATE)
    router.handle(C1, submit("b"), LATE)
    router.handle(C1, submit("c"), LATE)  # queued behind a and b
    out = router.handle(C1, Cancel("a"), LATE)
    assert (W1, Cancel("a")) in out
    assert [e.code for _, e in of(out, Error)] == [errors.CancelledError.code]
    assert [m.request_id for _, m in of(out, Request)] == ["c"]
    assert router.handle(C2, Cancel("b"), LATE) == []  # only the owner may cancel


def test_deadlines_expire_in_the_queue_and_while_generating(router):
    router.handle(C1, submit("run", timeout_s=5), LATE)
    router.handle(C1, submit("other"), LATE)
    router.handle(C1, submit("wait", timeout_s=1), LATE)
    out = router.tick(LATE + 1)
    assert [(p, e.request_id, e.code) for p, e in of(out, Error)] == [(C1, "wait", "request.timeout")]
    router.handle(W1, Heartbeat(), LATE + 4)
    out = router.tick(LATE + 5)
    assert (W1, Cancel("run")) in out and of(out, Error)[0][1].code == "request.timeout"


def test_stale_and_unknown_workers_are_told_once(router):
    assert router.handle(W2, Heartbeat(), LATE) == [(W2, Disconnect())]
    assert router.handle(W2, Heartbeat(), LATE) == []
    assert router.handle(W1, Partial("ghost", 0, 1, "x", 0), LATE) == [(W1, Cancel("ghost"))]


def test_resent_submit_is_not_run_twice_and_ping_names_forgotten_requests(router):
    router.handle(C1, submit("r"), LATE)
    assert router.handle(C1, submit("r"), LATE) == []
    assert router.counters.submitted == 1
    assert router.handle(C1, Ping(["r", "gone"]), LATE) == [(C1, Pong(["gone"]))]


def test_heartbeats_go_to_workers_each_interval(router):
    assert of(router.tick(LATE), Heartbeat) == [(W1, Heartbeat())]
    assert of(router.tick(LATE + timing.HEARTBEAT_INTERVAL_S / 2), Heartbeat) == []


def test_status_reports_workers_queues_and_counters(router):
    for i in range(3):
        router.handle(C1, submit(f"r{i}"), LATE)
    (_, reply), = router.handle(C2, Status(), LATE)
    assert isinstance(reply, StatusReply)
    s = reply.status
    assert s["queues"] == {"m": 1} and s["in_flight"] == 2
    assert s["workers"][0]["active"] == 2 and s["workers"][0]["slots"] == 2
    assert s["counters"]["submitted"] == 3 and s["counters"]["dispatched"] == 2


def test_orphaned_queue_fails_after_the_grace(router):
    router.handle(C1, submit("a"), LATE)
    router.handle(W1, Disconnect(["a"]), LATE)
    assert of(router.tick(LATE + timing.BROKER_GRACE_S / 2), Error) == []
    (_, err), = of(router.tick(LATE + timing.BROKER_GRACE_S), Error)
    assert err.code == errors.ModelNotFoundError.code


def test_requests_of_a_silent_client_are_cancelled_on_the_worker(router):
    router.handle(C1, submit("mine"), LATE)
    router.handle(C2, submit("theirs"), LATE)
    later = LATE + timing.CLIENT_UNAVAILABLE_S + 0.01
    router.handle(W1, Heartbeat(), later)
    router.handle(C2, Ping(["theirs"]), later)  # C2 still waits; C1 went away
    out = router.tick(later)
    assert (W1, Cancel("mine")) in out and "theirs" in router.jobs and "mine" not in router.jobs


def test_supervisor_reports_are_listed_per_host_until_they_go_stale(router):
    failing = {"name": "GPU.1", "device": "GPU.1", "state": "failing", "pid": None,
               "reason": "gave up after 5 failed starts in a row; last: error: model cache MISS"}
    assert router.handle(C1, Supervised("a", 10, [{"name": "CPU", "state": "starting"}]), LATE) == []
    router.handle(C1, Supervised("a", 10, [failing]), LATE + 1)  # the latest report replaces the older
    router.handle(C2, Supervised("b", 20, [{"name": "CPU", "state": "ready"}]), LATE + 2)
    assert router.status(LATE + 2)["supervised"] == [
        {**failing, "host": "a"}, {"name": "CPU", "state": "ready", "host": "b"}]
    router.tick(LATE + 1 + timing.SUPERVISED_EXPIRY_S)  # host a stopped reporting (serve is gone)
    assert [s["host"] for s in router.status(LATE + 3)["supervised"]] == ["b"]
    (_, err), = router.handle(C1, Supervised("a", 10, ["not a map"]), LATE + 3)
    assert err.code == errors.MalformedMessageError.code and "workers" in err.message


def test_a_broker_behind_on_reading_judges_no_worker_silent(router):
    """A heartbeat may wait among the messages the server has not read yet."""
    late = LATE + timing.HEARTBEAT_EXPIRY_S + 0.01
    assert not of(router.tick(late, caught_up=False), Request) and W1 in router.workers
    router.tick(late, caught_up=True)
    assert W1 not in router.workers


def test_a_stream_gets_its_credit_then_waits_with_its_final_behind(router):
    (w, _), = router.handle(C1, submit("r", window=2), LATE)
    tokens = [Partial("r", i, i, str(i), i) for i in range(4)]
    sent = [m for t in tokens for _, m in of(router.handle(w, t, LATE), Partial)]
    assert sent == tokens[:2]  # the window; the rest waits in the broker
    assert of(router.handle(w, Final("r", {}, 4), LATE), Final) == []
    assert router.status(LATE)["streams"] == {"open": 1, "held": 2}
    out = router.handle(C1, Credit("r", 5), LATE)
    assert [m for _, m in out] == [tokens[2], tokens[3], Final("r", {}, 4)]
    assert router.status(LATE)["streams"] == {"open": 0, "held": 0}
    assert router.handle(C1, Ping(["r"]), LATE) == [(C1, Pong(["r"]))]


def test_a_stream_unread_for_stream_stall_s_fails_and_stops_its_worker():
    r = Router(now=0.0, stream_stall_s=5.0)
    r.handle(W1, ready(), LATE)
    (w, _), = r.handle(C1, submit("r", window=1), LATE)
    r.handle(w, Partial("r", 0, 0, "a", 0), LATE)
    r.handle(w, Partial("r", 1, 1, "b", 1), LATE)  # no credit left: it waits
    r.handle(w, Heartbeat(), LATE + 5)
    r.handle(C1, Ping(["r"]), LATE + 5)
    out = r.tick(LATE + 5)
    assert (w, Cancel("r")) in out
    (_, err), = of(out, Error)
    assert err.code == errors.ClientTooSlowError.code and "stream_stall_s" in err.message


def test_another_clients_reuse_of_a_running_id_is_refused(router):
    router.handle(C1, submit("r"), LATE)
    (peer, err), = router.handle(C2, submit("r"), LATE)
    assert peer == C2 and err.code == errors.InvalidRequestError.code and "another client" in err.message
    assert router.jobs["r"].client == C1


def test_a_request_without_progress_moves_and_its_worker_draws_no_more():
    r = Router(now=0.0, progress_timeout_s=2.0)
    r.handle(W1, ready(slots=4), LATE)
    (first, _), = r.handle(C1, submit("r"), LATE)
    r.tick(LATE + 0.1)  # stamps the dispatch
    r.handle(W2, ready(slots=1), LATE + 1)
    for t in (LATE + 2.05, LATE + 2.1):
        r.handle(W1, Heartbeat(), t)
        r.handle(W2, Heartbeat(), t)
    out = r.tick(LATE + 2.2)
    assert (W1, Cancel("r")) in out and of(out, Request)[0][0] == W2
    assert r.workers[W1].cap == 0 and r.status(LATE + 2.2)["counters"]["stalled"] == 1
    assert of(r.handle(C1, submit("s"), LATE + 2.2), Request) == []  # W1 draws nothing new


def test_a_workers_replies_return_it_credit_each_quarter_window(router):
    (w, _), = router.handle(C1, submit("r", max_tokens=100), LATE)
    credits = [m for i in range(WORKER_WINDOW // 4)
               for _, m in router.handle(w, Partial("r", i, i, "x", i), LATE) if isinstance(m, Credit)]
    assert credits == [Credit("", WORKER_WINDOW // 4)]


def _load_failed(worker_id="CPU@h:9", models=("smollm2",)):
    return LoadFailed(worker_id, list(models), "CPU", "h", 9, errors.UnsupportedModelError.code,
                      "architecture 'mamba' (general.architecture) is not supported")


def test_a_load_failure_fails_what_waits_for_its_model_and_names_the_worker():
    r = Router(now=0.0)
    assert r.handle(C1, submit("a", model=""), 0.1) == []  # waits for a model during the grace
    (peer, err), = of(r.handle(b"w-dealer", _load_failed(), 0.5), Error)
    assert peer == C1 and err.code == errors.ModelNotFoundError.code
    assert err.message == ("no worker serves any model yet: worker CPU@h:9 failed: architecture"
                           " 'mamba' (general.architecture) is not supported")
    (_, err), = r.handle(C2, submit("b", model="smollm2"), 0.6)  # at once, grace or not
    assert err.message.startswith("no worker serves model 'smollm2': worker CPU@h:9 failed")
    assert [f["id"] for f in r.status(0.7)["failed"]] == ["CPU@h:9"]
    r.handle(W1, Ready("CPU@h:10", ["smollm2"], "CPU", 2, "h", 10), 1.0)  # fixed and restarted
    assert r.status(1.0)["failed"] == []
    assert of(r.handle(C1, submit("c", model="smollm2"), 1.1), Request)


def test_shutdown_tells_the_workers_to_register_again_and_the_clients_it_is_gone(router):
    router.handle(C1, submit("a"), LATE)
    router.handle(C2, Ping([]), LATE)
    out = router.shutdown(LATE + 1)
    assert of(out, Disconnect) == [(W1, Disconnect())]
    bye = Shutdown("stopped by a signal")
    assert of(out, Shutdown) == [(C1, bye), (C2, bye)]


def test_a_worker_a_stall_left_drawing_nothing_takes_requests_again_once_it_replies():
    """A long step stalled its only request; without this it would never get one again (only a
    FINAL raises its cap, and it runs nothing)."""
    r = Router(now=0.0, progress_timeout_s=2.0)
    r.handle(W1, ready(slots=4), LATE)
    r.handle(C1, submit("r", timeout_s=100), LATE)
    r.tick(LATE + 0.1)
    r.handle(W1, Heartbeat(), LATE + 2)
    r.tick(LATE + 2.2)
    assert r.workers[W1].cap == 0 and of(r.handle(C1, submit("s"), LATE + 2.3), Request) == []
    out = r.handle(W1, Partial("r", 0, 5, "a", 0), LATE + 3)  # its step ended: a token of the old run
    assert (W1, Cancel("r")) in out and [m.request_id for _, m in of(out, Request)] == ["r"]
    assert r.workers[W1].cap == 1
