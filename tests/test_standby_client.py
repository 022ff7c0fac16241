"""A client's failover between the endpoints of a standby pair, without sockets (PendingRequests)."""

from __future__ import annotations

from test_client_pending import Recorder

from ovpool import errors, timing
from ovpool.pending import PendingRequests
from ovpool.protocol import Error, Partial, Status, StatusReply
from ovpool.submit import make_submit

NOT_ACTIVE = errors.NotActiveError.code
LATER = timing.HEARTBEAT_INTERVAL_S  # past the least time between two failovers


def pair(now: float = 0.0) -> PendingRequests:
    p = PendingRequests(now, broker="tcp://a:1", endpoints=2)
    p.link(True, now)
    return p


def test_a_refusal_moves_the_stream_and_resends_it_with_credit_for_its_replay():
    p, rec = pair(), Recorder()
    sub = make_submit("hi", "m", None, {}, window=8)
    p.add(sub, rec, 0.0)
    for seq in range(3):
        p.on_message(Partial(sub.request_id, seq, seq, str(seq), seq), 0.1)
    assert p.on_message(Error(sub.request_id, NOT_ACTIVE, "passive"), 0.2) == []
    assert rec.error is None and len(p) == 1
    assert p.wants_failover(LATER)
    (resent,) = p.switched("tcp://b:1", LATER)
    assert resent.request_id == sub.request_id and resent.window == 8 + 3
    assert not p.wants_failover(LATER)
    for seq in range(5):  # the new broker replays from the start
        p.on_message(Partial(sub.request_id, seq, seq, str(seq), seq), LATER + 0.1)
    assert [d.index for d in rec.deltas] == [0, 1, 2, 3, 4]


def test_a_lost_broker_is_a_failover_until_the_budget_ends():
    p, rec = pair(), Recorder()
    p.add(make_submit("hi", "m", None, {}), rec, 0.0)
    p.link(False, 0.0)  # the connection dropped (kill -9)
    t = p.failover_budget_s / 4
    assert p.tick(t) == [] and p.wants_failover(t) and rec.error is None
    p.switched("tcp://b:1", t)
    p.tick(t + p.failover_budget_s)
    assert isinstance(rec.error, errors.BrokerUnavailableError)
    assert not p.wants_failover(t + p.failover_budget_s)


def test_one_endpoint_fails_on_a_refusal():
    p, rec = PendingRequests(0.0, broker="tcp://a:1"), Recorder()
    sub = make_submit("hi", "m", None, {})
    p.add(sub, rec, 0.0)
    p.on_message(Error(sub.request_id, NOT_ACTIVE, "passive"), 0.1)
    assert isinstance(rec.error, errors.NotActiveError)
    assert not p.wants_failover(LATER)


def test_a_passive_brokers_status_is_asked_again_of_the_other():
    p, rec = pair(), Recorder()
    p.add_status_waiter(rec, 0.0, Status())
    p.on_message(StatusReply({"workers": [], "standby": {"state": "passive"}}), 0.1)
    assert rec.result is None
    assert p.wants_failover(LATER)
    assert p.switched("tcp://b:1", LATER) == [Status()]
    p.on_message(StatusReply({"workers": [1], "standby": {"state": "active"}}), LATER + 0.1)
    assert rec.result == {"workers": [1], "standby": {"state": "active"}}


def test_two_refusing_brokers_fail_the_request_once_the_budget_ends():
    p, rec = pair(), Recorder()
    sub = make_submit("hi", "m", None, {})
    p.add(sub, rec, 0.0)
    t = 0.0
    while rec.error is None and t < 10 * p.failover_budget_s:
        p.on_message(Error(sub.request_id, NOT_ACTIVE, "passive"), t)
        t += LATER
        if p.wants_failover(t):
            p.switched("tcp://b:1", t)
            p.link(True, t)
    assert isinstance(rec.error, errors.NotActiveError)
    assert str(rec.error).startswith("no broker of the standby pair took the request in")


def test_an_idle_client_moves_off_an_unreachable_endpoint():
    p = PendingRequests(0.0, broker="tcp://a:1", connect_timeout_s=2.0, endpoints=2)
    assert p.tick(1.0) == [] and not p.wants_failover(1.0)
    p.tick(2.0)
    assert p.wants_failover(2.0)
