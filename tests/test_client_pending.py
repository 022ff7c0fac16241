"""The client's bookkeeping without sockets: dedupe, resend after a broker restart, deadlines."""

from __future__ import annotations

import pytest

from ovpool import errors, timing
from ovpool.completion import Completion, Usage
from ovpool.pending import PendingRequests
from ovpool.protocol import (
    Cancel,
    Error,
    Final,
    Partial,
    Ping,
    Pong,
    Shutdown,
    StatusReply,
    Submit,
)
from ovpool.submit import make_submit


class Recorder:
    streams = True

    def __init__(self):
        self.deltas, self.result, self.error = [], None, None

    def delta(self, d):
        self.deltas.append(d)

    def done(self, c):
        self.result = c

    def fail(self, e):
        self.error = e


def final(rid, partials=0):
    return Final(rid, Completion("ab", [1, 2], "length", Usage(1, 2)).to_dict(), partials)


def test_make_submit_validates_and_fixes_a_seed():
    s = make_submit("hi", "m", 5.0, {"max_tokens": 3})
    assert s.params["max_tokens"] == 3 and isinstance(s.params["seed"], int) and s.timeout_s == 5.0
    assert make_submit([{"role": "user", "content": "x"}], "", None, {}).messages
    with pytest.raises(errors.InvalidRequestError, match="temperature"):
        make_submit("hi", "m", None, {"temperature": -1})
    with pytest.raises(errors.InvalidRequestError, match="timeout"):
        make_submit("hi", "m", 0, {})


def test_token_indices_are_delivered_once_in_order():
    p, rec = PendingRequests(0.0), Recorder()
    sub = make_submit("hi", "m", None, {}, window=8)
    p.add(sub, rec, 0.0)
    for i in (0, 1, 0, 1, 2):  # a replay after a re-dispatch repeats 0 and 1
        p.on_message(Partial(sub.request_id, i, i, str(i), i), 0.1)
    p.on_message(final(sub.request_id, 3), 0.2)
    assert [d.index for d in rec.deltas] == [0, 1, 2]
    assert rec.result.text == "ab" and len(p) == 0


def test_requests_a_restarted_broker_forgot_are_resent_unchanged():
    p = PendingRequests(0.0)
    a, b = make_submit("a", "m", None, {}), make_submit("b", "m", None, {})
    p.add(a, Recorder(), 0.0)
    p.add(b, Recorder(), 0.0)
    (ping,) = p.tick(0.0)
    assert isinstance(ping, Ping) and set(ping.request_ids) == {a.request_id, b.request_id}
    assert p.on_message(Pong([b.request_id, "not-mine"]), 0.1) == [b]


def test_remote_errors_come_back_as_their_class():
    p, rec = PendingRequests(0.0), Recorder()
    sub = make_submit("a", "m", None, {})
    p.add(sub, rec, 0.0)
    p.on_message(Error(sub.request_id, "request.queue_full", "full"), 0.1)
    assert isinstance(rec.error, errors.QueueFullError) and str(rec.error) == "full"


def test_local_deadline_and_broker_silence_fail_requests():
    p, timed, other = PendingRequests(0.0, unavailable_s=100.0), Recorder(), Recorder()
    p.link(True, 0.0)
    timed_submit = make_submit("a", "m", 1.0, {})
    p.add(timed_submit, timed, 0.0)
    p.add(make_submit("b", "m", None, {}), other, 0.0)
    assert Cancel(timed_submit.request_id) in p.tick(1.0 + timing.HEARTBEAT_INTERVAL_S)  # freed there
    assert isinstance(timed.error, errors.RequestTimeoutError) and other.error is None
    p.tick(100.0)
    assert isinstance(other.error, errors.BrokerLostError)  # a BrokerUnavailableError, as before
    assert "connected but has not answered for 100.0 s: its process is stopped" in str(other.error)


def _waiting(p: PendingRequests) -> Recorder:
    rec = Recorder()
    p.add(make_submit("a", "m", None, {}), rec, 0.0)
    return rec


def test_no_connection_within_connect_timeout_names_the_endpoint_and_no_curve_unless_used():
    p = PendingRequests(0.0, broker="tcp://10.0.0.9:5555", connect_timeout_s=2.0)
    rec = _waiting(p)
    p.tick(1.9)
    assert rec.error is None
    p.tick(2.0)
    assert type(rec.error) is errors.BrokerUnavailableError  # never reached: not a lost broker
    assert str(rec.error).startswith("cannot reach the broker at tcp://10.0.0.9:5555: no connection in 2 s")
    assert "CURVE" not in str(rec.error) and "connect_timeout_s" in str(rec.error)
    curved = PendingRequests(0.0, broker="tcp://h:1", curve=True)
    curved.link(False, 0.5, tcp=True)  # TCP accepted, the CURVE handshake never answered
    rec = _waiting(curved)
    curved.tick(2.0)
    assert "accepts connections but no ovpool handshake completed" in str(rec.error)
    assert "curve_server_key must hold that broker's public key" in str(rec.error)


def test_silence_counts_only_once_a_handshake_completed():
    p = PendingRequests(0.0, unavailable_s=3.0, broker="tcp://h:1", connect_timeout_s=60.0)
    p.link(False, 0.0, tcp=True)  # accepted; the broker's security check still runs
    rec = _waiting(p)
    p.tick(30.0)
    assert rec.error is None
    p.tick(60.0)
    assert "no ovpool handshake completed in 60 s" in str(rec.error)


def test_a_dropped_connection_that_comes_back_in_time_keeps_the_requests():
    p = PendingRequests(0.0, broker="ipc:///tmp/b", connect_timeout_s=2.0)
    p.link(True, 0.0)
    rec = _waiting(p)
    p.link(False, 10.0)  # the broker crashed ...
    p.tick(11.5)
    p.link(True, 11.5)  # ... and a new one came up at the same address: PING/PONG resend
    p.tick(20.0)
    assert rec.error is None
    p.link(False, 21.0)
    p.tick(23.0)
    assert isinstance(rec.error, errors.BrokerLostError)
    assert str(rec.error).startswith("lost the connection to the broker at ipc:///tmp/b and it did not"
                                     " come back in 2 s: its process exited or was killed")


def test_a_broker_that_shuts_down_fails_what_waits_at_once():
    p = PendingRequests(0.0, broker="tcp://127.0.0.1:5555")
    p.link(True, 0.0)
    rec, status = _waiting(p), Recorder()
    p.add_status_waiter(status, 0.0)
    p.on_message(Shutdown("stopped by a signal"), 0.1)
    assert isinstance(rec.error, errors.BrokerUnavailableError) and len(p) == 0
    assert str(rec.error) == ("the broker at tcp://127.0.0.1:5555 shut down before answering"
                              " (stopped by a signal); start it again and resend")
    assert isinstance(status.error, errors.BrokerUnavailableError)


def test_status_replies_go_to_waiters_in_order():
    p, first, second = PendingRequests(0.0), Recorder(), Recorder()
    p.add_status_waiter(first, 0.0)
    p.add_status_waiter(second, 0.0)
    p.on_message(StatusReply({"n": 1}), 0.1)
    p.on_message(StatusReply({"n": 2}), 0.1)
    assert first.result == {"n": 1} and second.result == {"n": 2}


def test_a_missing_partial_fails_the_stream_and_cancels_it():
    p, rec = PendingRequests(0.0), Recorder()
    sub = make_submit("hi", "m", None, {}, window=8)
    p.add(sub, rec, 0.0)
    p.on_message(Partial(sub.request_id, 0, 0, "a", 0), 0.1)
    assert p.on_message(Partial(sub.request_id, 5, 5, "f", 2), 0.1) == [Cancel(sub.request_id)]
    assert isinstance(rec.error, errors.StreamGapError) and "PARTIAL 2 came after 0" in str(rec.error)
    assert [d.text for d in rec.deltas] == ["a"] and len(p) == 0


def test_a_final_after_fewer_partials_than_it_counts_is_a_gap():
    p, rec = PendingRequests(0.0), Recorder()
    sub = make_submit("hi", "m", None, {}, window=8)
    p.add(sub, rec, 0.0)
    p.on_message(Partial(sub.request_id, 0, 0, "a", 0), 0.1)
    assert p.on_message(final(sub.request_id, 2), 0.2) == [Cancel(sub.request_id)]
    assert isinstance(rec.error, errors.StreamGapError) and rec.result is None


def test_a_resent_stream_gets_credit_for_the_replay_it_drops():
    p, rec = PendingRequests(0.0), Recorder()
    sub = make_submit("hi", "m", None, {}, window=8)
    p.add(sub, rec, 0.0)
    for i in range(3):
        p.on_message(Partial(sub.request_id, i, i, "x", i), 0.1)
    (resent,) = p.on_message(Pong([sub.request_id]), 0.2)
    assert resent.request_id == sub.request_id and resent.window == 8 + 3


def test_a_reply_it_cannot_use_fails_only_its_request_and_is_counted():
    p, bad, good = PendingRequests(0.0), Recorder(), Recorder()
    a, b = make_submit("a", "m", None, {}), make_submit("b", "m", None, {})
    p.add(a, bad, 0.0)
    p.add(b, good, 0.0)
    assert p.on_message(Final(a.request_id, {"text": "x"}), 0.1) == [Cancel(a.request_id)]
    assert isinstance(bad.error, errors.MalformedMessageError)
    assert "FINAL.completion.token_ids must be a list of ints" in str(bad.error)
    p.on_message(final(b.request_id), 0.2)
    assert good.result.text == "ab" and good.error is None and p.malformed == 1 and len(p) == 0


def test_a_pong_resends_only_outstanding_ids_whatever_else_it_lists():
    p, a = PendingRequests(0.0), make_submit("a", "m", None, {})
    p.add(a, Recorder(), 0.0)
    assert p.on_message(Pong([[1], {"x": 1}, 5, a.request_id]), 0.1) == [a]  # unhashable: no TypeError


def test_a_submit_that_cannot_be_encoded_fails_alone_and_is_never_resent():
    p, rec, other = PendingRequests(0.0), Recorder(), Recorder()
    unencodable = Submit("r1", "m", {"seed": 2**64}, "x")
    p.add(unencodable, rec, 0.0)
    p.add(make_submit("b", "m", None, {}), other, 0.0)
    p.unsendable(unencodable, OverflowError("Integer value out of range"))
    assert isinstance(rec.error, errors.InvalidRequestError)
    assert "request r1 cannot be encoded" in str(rec.error)
    assert p.on_message(Pong(["r1"]), 0.1) == [] and len(p) == 1 and other.error is None


def test_closing_fails_whats_left_here_and_cancels_it_at_the_broker():
    p, kept, left, gone = PendingRequests(0.0), Recorder(), Recorder(), Recorder()
    done, waiting, abandoned = (make_submit("hi", "m", None, {}) for _ in range(3))
    for sub, rec in ((done, kept), (waiting, left), (abandoned, gone)):
        p.add(sub, rec, 0.0)
    p.on_message(final(done.request_id), 0.1)
    assert p.abandon(abandoned.request_id) == [Cancel(abandoned.request_id)]
    assert p.close() == [Cancel(waiting.request_id)]
    assert isinstance(left.error, errors.BrokerUnavailableError) and "closed" in str(left.error)
    assert kept.error is None and kept.result is not None and gone.error is None
    assert p.close() == []
