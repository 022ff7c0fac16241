"""Prefix-aware placement as pure logic: which free worker gets a request whose prompt some hold."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ovpool.broker.placement import AFFINITY_SLACK, Placement
from ovpool.broker.prefixes import HeldPrefixes
from ovpool.broker.router import Router
from ovpool.broker.state import Counters, Job, RegisteredWorker
from ovpool.prefix_key import after_answer, route_keys
from ovpool.protocol import Final, Heartbeat, Ready, Request, Submit

SYSTEM = {"role": "system", "content": "Be brief. " * 100}


def worker(identity: bytes, slots: int = 8) -> RegisteredWorker:
    return RegisteredWorker(identity, Ready("w", ["m"], "CPU", slots, "host", 1), expires=1e9)


def conversation(n: int, turns: int = 1) -> list[dict]:
    msgs = [SYSTEM]
    for t in range(turns):
        msgs += [{"role": "user", "content": f"chat {n} question {t}"}]
        if t < turns - 1:
            msgs += [{"role": "assistant", "content": f"chat {n} answer {t}"}]
    return msgs


def job(rid: str, messages: list[dict]) -> Job:
    route = route_keys("m", messages=messages)
    return Job(Request(rid, "m", {"max_tokens": 1}, None, messages, list(route.keys)), b"client",
               float("inf"), queued_at=0.0, route=route)


def placement(prefix_routing: bool = True) -> Placement:
    return Placement(max_attempts=3, counters=Counters(), prefix_routing=prefix_routing)


def dispatched(out) -> list[tuple[bytes, str]]:
    return [(peer, m.request_id) for peer, m in out if isinstance(m, Request)]


def test_a_chats_next_turn_goes_to_the_worker_that_answered_the_last_one():
    p, out = placement(), []
    for name in (b"A", b"B"):
        p.add_worker(worker(name), out)
    p.submit(job("t1", conversation(0)), out)
    p.finished_on(p.workers[b"A"], p.jobs["t1"], "chat 0 answer 0")
    p.finish(p.jobs["t1"], out)
    p.submit(job("busy", [{"role": "user", "content": "unrelated"}]), out)  # A: the first of the idle
    p.submit(job("t2", conversation(0, turns=2)), out)  # history + that answer + a new question
    # A is busier than B now, but holds the whole history.
    assert dispatched(out) == [(b"A", "t1"), (b"A", "busy"), (b"A", "t2")]
    assert (p.counters.prefix_hits, p.counters.prefix_misses) == (1, 2)


def test_affinity_yields_to_load_beyond_the_slack():
    p, out = placement(), []
    for name in (b"A", b"B"):
        p.add_worker(worker(name, slots=8), out)
    for i in range(6):
        p.submit(job(f"r{i}", conversation(i)), out)
    # Every chat shares the system prompt: the first few go where it was sent first, then the load
    # gap passes AFFINITY_SLACK (2 of 8 slots) and B takes one; then both hold it and the less
    # busy one gets the next.
    assert [peer for peer, _ in dispatched(out)] == [b"A", b"A", b"A", b"B", b"B", b"B"]


def test_least_loaded_routing_ignores_prefixes():
    p, out = placement(prefix_routing=False), []
    for name in (b"A", b"B"):
        p.add_worker(worker(name), out)
    p.submit(job("t1", conversation(0)), out)
    p.finished_on(p.workers[b"A"], p.jobs["t1"], "chat 0 answer 0")
    p.finish(p.jobs["t1"], out)
    p.submit(job("busy", conversation(5)), out)  # A again (the first of the least busy)
    p.submit(job("t2", conversation(0, turns=2)), out)
    assert dispatched(out)[-1] == (b"B", "t2") and p.counters.prefix_hits == 0


def test_a_workers_report_corrects_what_the_broker_remembered():
    held = HeldPrefixes()
    keys = route_keys("m", messages=conversation(0)).keys
    held.remember(keys)
    held.report([], 10, 0)  # the report may predate the dispatch: the memory survives it
    assert keys[-1] in held
    held.report([], 20, 5)  # a full interval later the worker would have reported it
    assert keys[-1] not in held and len(held) == 0
    held.report(keys[:1], 30, 25)
    assert keys[0] in held and held.describe() == {"prompt_tokens": 30, "cached_prompt_tokens": 25,
                                                   "held_keys": 1}


def test_report_reaches_the_worker_through_placement():
    p, out = placement(), []
    p.add_worker(worker(b"A"), out)
    keys = tuple(route_keys("m", messages=conversation(3)).keys)
    p.report(p.workers[b"A"], keys, Heartbeat(list(keys), 100, 40))
    assert p.workers[b"A"].describe(0.0)["prefix_cache"] == {
        "prompt_tokens": 100, "cached_prompt_tokens": 40, "held_keys": len(keys)}


def test_the_answer_is_remembered_as_the_next_turns_prefix():
    p, out = placement(), []
    p.add_worker(worker(b"A"), out)
    p.submit(job("t1", conversation(7)), out)
    p.finished_on(p.workers[b"A"], p.jobs["t1"], "chat 7 answer 0")
    nxt = after_answer("m", None, conversation(7), "chat 7 answer 0")
    assert nxt.keys[-1] in p.workers[b"A"].prefixes


# -- _choose, for any state of the workers ------------------------------------------------------

CHATS = [route_keys("m", messages=conversation(i, turns=2)) for i in range(4)]

_worker_state = st.tuples(st.integers(1, 4), st.integers(0, 4), st.sets(st.integers(0, 3)),
                          st.integers(0, 2))  # slots, in flight, chats held, how deep


@settings(max_examples=500, deadline=None)
@given(st.lists(_worker_state, min_size=1, max_size=5), st.integers(0, 3), st.booleans())
def test_the_chosen_worker_is_free_and_within_the_slack_of_the_least_busy(states, chat, prefix):
    p, out = placement(prefix), []
    for i, (slots, inflight, chats, depth) in enumerate(states):
        w = worker(f"w{i}".encode(), slots)
        p.add_worker(w, out)
        w.inflight.update(f"x{i}-{k}" for k in range(min(inflight, slots)))
        w.prefixes.report([CHATS[c].keys[depth] for c in chats], 0, 0)
    j = job("r", conversation(chat, turns=2))
    chosen = p._choose("m", j)
    free = [w for w in p.workers.values() if len(w.inflight) < w.cap]
    if not free:  # never a full worker
        assert chosen is None
        return
    busy = {w.identity: len(w.inflight) / w.info.slots for w in free}
    least = min(busy.values())
    assert chosen in free and busy[chosen.identity] <= least + AFFINITY_SLACK
    if not prefix or all(w.prefixes.depth(j.route) == 0 for w in free):
        assert busy[chosen.identity] == least  # least-loaded when nothing is held (or routing is off)
    else:  # the deepest holder among those within the slack
        near = [w for w in free if busy[w.identity] <= least + AFFINITY_SLACK]
        assert chosen.prefixes.depth(j.route) == max(w.prefixes.depth(j.route) for w in near)


# -- through the Router: REQUEST carries the keys, HEARTBEAT reports, FINAL's answer ------------

def test_the_router_ships_route_keys_and_takes_heartbeat_reports():
    r, w1, w2, c = Router(now=0.0), b"w1", b"w2", b"c"
    for w in (w1, w2):
        r.handle(w, Ready("w", ["m"], "CPU", 4, "host", 1), 100.0)
    out = r.handle(c, Submit("t1", "m", {"max_tokens": 2}, messages=conversation(0)), 100.0)
    (peer, req), = [(p, m) for p, m in out if isinstance(m, Request)]
    assert req.route_keys == list(route_keys("m", messages=conversation(0)).keys)
    r.handle(peer, Final("t1", {"text": "chat 0 answer 0"}), 100.0)
    # The other worker reports the system prompt; the one that answered reports nothing yet.
    other = w2 if peer == w1 else w1
    r.handle(other, Heartbeat(req.route_keys[:1], 50, 10), 100.0)
    out = r.handle(c, Submit("t2", "m", {"max_tokens": 2}, messages=conversation(0, turns=2)), 100.0)
    assert [p for p, m in out if isinstance(m, Request)] == [peer]
    status = r.status(100.0)
    assert status["counters"]["prefix_hits"] == 1 and status["counters"]["prefix_misses"] == 1
    assert {w["prefix_cache"]["prompt_tokens"] for w in status["workers"]} == {0, 50}


def test_a_heartbeat_with_malformed_keys_counts_as_malformed_and_keeps_the_worker():
    r = Router(now=0.0)
    r.handle(b"w", Ready("w", ["m"], "CPU", 4, "host", 1), 1.0)
    assert r.handle(b"w", Heartbeat([b"short"], 1, 0), 2.0) == []
    assert r.counters.malformed == 1 and b"w" in r.workers
    assert r.workers[b"w"].expires > 2.0


def test_least_loaded_routing_sends_no_route_keys():
    r = Router(now=0.0, prefix_routing=False)
    r.handle(b"w", Ready("w", ["m"], "CPU", 4, "host", 1), 100.0)
    out = r.handle(b"c", Submit("t", "m", {"max_tokens": 2}, messages=conversation(0)), 100.0)
    assert [m.route_keys for _, m in out if isinstance(m, Request)] == [[]]
