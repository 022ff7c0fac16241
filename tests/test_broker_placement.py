"""Placement as pure logic: which request waits where and which worker runs it, no Router around it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ovpool import errors
from ovpool.broker.placement import Placement
from ovpool.broker.state import Counters, Job, RegisteredWorker
from ovpool.prefix_key import route_keys
from ovpool.protocol import Cancel, Error, Heartbeat, Ready, Request

MODELS = ("a", "b")


def worker(identity: bytes, slots: int = 2, models=("a",)) -> RegisteredWorker:
    return RegisteredWorker(identity, Ready("w", list(models), "CPU", slots, "host", 1), expires=1e9)


def job(rid: str, model: str = "a", at: float = 0.0) -> Job:
    return Job(Request(rid, model, {"max_tokens": 1}, "hi", None), b"client", float("inf"),
               queued_at=at, waiting_since=at)


def placement(max_attempts: int = 3) -> Placement:
    return Placement(max_attempts=max_attempts, counters=Counters())


def requests(out) -> list[tuple[bytes, str]]:
    return [(peer, m.request_id) for peer, m in out if isinstance(m, Request)]


def test_the_next_request_goes_to_the_worker_with_the_lowest_busy_fraction():
    p, out = placement(), []
    p.add_worker(worker(b"w2", slots=2), out)
    p.add_worker(worker(b"w4", slots=4), out)
    for i in range(7):
        p.submit(job(f"r{i}"), out)
    peers = [peer for peer, _ in requests(out)]
    assert peers.count(b"w2") == 2 and peers.count(b"w4") == 4
    assert list(p.queues["a"]) == ["r6"] and p.jobs["r6"].worker is None


def test_a_finished_request_frees_its_slot_for_the_head_of_the_queue():
    p, out = placement(), []
    p.add_worker(worker(b"w", slots=1), out)
    for rid in ("r0", "r1", "r2"):
        p.submit(job(rid), out)
    out.clear()
    p.finish(p.jobs["r0"], out)
    assert requests(out) == [(b"w", "r1")] and "r0" not in p.jobs
    p.finish(p.jobs["r2"], out)  # a queued request leaves its queue
    assert list(p.queues["a"]) == [] and p.workers[b"w"].inflight == {"r1"}


def test_a_lost_workers_requests_go_back_to_the_head_of_their_queue_oldest_first():
    p, out = placement(), []
    p.add_worker(worker(b"w", slots=2), out)
    for i, rid in enumerate(("old", "new", "waiting")):
        p.submit(job(rid, at=float(i)), out)
    p.drop_worker(p.workers[b"w"], 5.0, out, lost=True)
    assert list(p.queues["a"]) == ["old", "new", "waiting"]
    assert p.jobs["old"].waiting_since == 5.0 and p.counters.requeued == 2
    out.clear()
    p.add_worker(worker(b"w2", slots=1), out)
    assert requests(out) == [(b"w2", "old")] and p.jobs["old"].attempts == 2


def test_a_request_that_lost_its_worker_max_attempts_times_fails_with_worker_lost():
    p, out = placement(max_attempts=2), []
    p.submit(job("r"), out)
    for name in (b"w1", b"w2"):
        p.add_worker(worker(name, slots=1), out)
        p.drop_worker(p.workers[name], 1.0, out, lost=True)
    (peer, err), = [(peer, m) for peer, m in out if isinstance(m, Error)]
    assert peer == b"client" and err.code == errors.WorkerLostError.code and "2 times" in err.message
    assert "r" not in p.jobs and p.counters.failed == 1


def test_work_handed_back_on_purpose_does_not_count_as_an_attempt():
    p, out = placement(max_attempts=1), []
    p.add_worker(worker(b"w1", slots=1), out)
    p.submit(job("r"), out)
    p.drop_worker(p.workers[b"w1"], 1.0, out, lost=False)
    assert p.jobs["r"].attempts == 0 and list(p.queues["a"]) == ["r"]


def test_fail_cancels_on_the_worker_and_tells_the_client():
    p, out = placement(), []
    p.add_worker(worker(b"w"), out)
    p.submit(job("r"), out)
    out.clear()
    p.fail(p.jobs["r"], errors.CancelledError("stop"), out)
    assert out[0] == (b"w", Cancel("r"))
    assert out[1] == (b"client", Error("r", errors.CancelledError.code, "stop"))
    assert p.workers[b"w"].inflight == set()


def test_requests_that_named_no_model_go_to_the_only_model_once_one_is_served():
    p, out = placement(), []
    p.submit(job("r", model=""), out)
    assert p.only_model() is None and p.orphaned(p.jobs["r"]).code == errors.InvalidRequestError.code
    p.add_worker(worker(b"w", models=("a", "a-alias")), out)
    assert requests(out) == [(b"w", "r")] and p.jobs["r"].model == "a"
    assert p.served() == ["a", "a-alias"] and p.only_model() == "a"


def test_orphaned_names_why_no_worker_runs_the_request():
    p, out = placement(), []
    p.submit(job("never", model="x"), out)
    assert p.orphaned(p.jobs["never"]).code == errors.ModelNotFoundError.code
    p.add_worker(worker(b"w", models=("x",)), out)
    p.drop_worker(p.workers[b"w"], 1.0, out, lost=True)
    assert p.orphaned(p.jobs["never"]).code == errors.WorkerLostError.code


# -- every invariant after any sequence of events ----------------------------------------------

_op = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 3), st.sampled_from([("a",), ("b",), ("a", "b")])),
    st.tuples(st.just("submit"), st.sampled_from(MODELS), st.integers(0, 3)),
    st.tuples(st.just("finish"), st.integers(0, 40)),
    st.tuples(st.just("answer"), st.integers(0, 40)),
    st.tuples(st.just("report"), st.integers(0, 8), st.integers(0, 3)),
    st.tuples(st.just("fail"), st.integers(0, 40)),
    st.tuples(st.just("drop"), st.integers(0, 8), st.booleans()),
)


def _chat(n: int) -> list[dict]:
    return [{"role": "system", "content": "s" * 300}, {"role": "user", "content": str(n)}]


def _apply(p: Placement, op: tuple, step: int, out: list) -> None:
    kind = op[0]
    if kind == "add":
        p.add_worker(worker(f"w{step}".encode(), slots=op[1], models=op[2]), out)
    elif kind == "submit":  # chats 0-3 share a system prompt: prefix routing has a choice
        messages = _chat(op[2])
        route = route_keys(op[1], messages=messages)
        p.submit(Job(Request(f"r{step}", op[1], {}, None, messages, list(route.keys)), b"client",
                     float("inf"), queued_at=float(step), waiting_since=float(step), route=route), out)
    elif kind == "report" and p.workers:  # a heartbeat holding chat op[2]
        w = list(p.workers.values())[op[1] % len(p.workers)]
        keys = route_keys(w.info.models[0], messages=_chat(op[2])).keys
        p.report(w, keys, Heartbeat(list(keys), 1, 0))
    elif kind in ("finish", "fail", "answer") and p.jobs:
        j = list(p.jobs.values())[op[1] % len(p.jobs)]
        if kind == "answer" and j.worker is not None:  # a FINAL: its answer is remembered there
            p.finished_on(p.workers[j.worker], j, "an answer")
            p.finish(j, out)
        elif kind == "finish":
            p.finish(j, out)
        else:
            p.fail(j, errors.CancelledError("x"), out)
    elif kind == "drop" and p.workers:
        p.drop_worker(list(p.workers.values())[op[1] % len(p.workers)], float(step), out, lost=op[2])


def _check(p: Placement, max_attempts: int) -> None:
    queued = [rid for q in p.queues.values() for rid in q]
    running = [rid for w in p.workers.values() for rid in w.inflight]
    assert sorted(queued + running) == sorted(p.jobs)  # each job in exactly one place
    for w in p.workers.values():
        assert len(w.inflight) <= w.info.slots
        assert all(p.jobs[rid].worker == w.identity and p.jobs[rid].model in w.info.models
                   for rid in w.inflight)
    for model, q in p.queues.items():
        assert all(p.jobs[rid].worker is None and p.jobs[rid].model == model for rid in q)
        if q:  # work-conserving: nothing waits while a worker of its model has a free slot
            assert not p.has_free_slot(model)
    assert all(1 <= j.attempts <= max_attempts for j in p.jobs.values() if j.worker is not None)


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=40), st.integers(1, 3), st.booleans())
def test_placement_invariants_hold_after_any_sequence_of_events(ops, max_attempts, prefix_routing):
    p = Placement(max_attempts=max_attempts, counters=Counters(), prefix_routing=prefix_routing)
    for step, op in enumerate(ops):
        out: list = []
        _apply(p, op, step, out)
        _check(p, max_attempts)
        for peer, msg in out:  # every dispatch goes to a registered worker serving the model
            if isinstance(msg, Request):
                assert msg.model in p.workers[peer].info.models
