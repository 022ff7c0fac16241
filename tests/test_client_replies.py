"""Issue 24, the clients' side: no single message stops a client. Each client is driven against a
fake broker (a ROUTER socket played by the test): a malformed reply fails only its own request, a
request that cannot be encoded fails alone and is never resent, and a client whose I/O loop
stopped anyway says so at once instead of leaving its callers waiting."""

from __future__ import annotations

import threading

import pytest
from fake_broker import DRIVERS, FakeBroker, completion, raw

from ovpool import errors
from ovpool.client_link import LinkState
from ovpool.protocol import Cancel, Final, Partial, Pong, Submit

WAIT_S = 10  # a bound for an answer already on its way, never a timing assumption
FINAL, PARTIAL = Final.command, Partial.command


@pytest.fixture
def broker():
    with FakeBroker() as fake:
        yield fake


@pytest.fixture(params=list(DRIVERS))
def client(request, broker):
    driver = DRIVERS[request.param](broker.endpoint)
    yield driver
    driver.close()


def serves_the_next_request(client, broker) -> None:
    future = client.submit("next")
    broker.answer(future.request_id, "next")
    assert future.result(WAIT_S).text == "next"
    assert client.client.healthy


def expect_cancel(broker, request_id: str) -> None:
    """The client told the broker to stop the request (its worker's slot is freed)."""
    while broker.receive() != Cancel(request_id):
        pass


def bad_final(request_id: str, **changed) -> list[bytes]:
    body = {**completion(), **changed}
    return raw(FINAL, {"request_id": request_id, "completion": {k: v for k, v in body.items() if v != "-"}})


@pytest.mark.parametrize("change, words", [
    ({"text": "-"}, "FINAL.completion.text is missing"),  # was a KeyError in the reader
    ({"logprobs": [[1, "a"]]}, r"FINAL.completion.logprobs\[0\] must be"),  # was an IndexError
    ({"usage": {"prompt_tokens": "1", "completion_tokens": 2}}, "usage.prompt_tokens must be int"),
    ({"token_ids": [1, None]}, "token_ids must be a list of ints"),
])
def test_a_malformed_final_fails_only_its_request(client, broker, change, words):
    bad, good = client.submit("bad"), client.submit("good")
    broker.submit(bad.request_id)
    broker.submit(good.request_id)
    broker.send(bad_final(bad.request_id, **change))
    broker.send(Final(good.request_id, completion("good")))
    with pytest.raises(errors.MalformedMessageError, match=words):
        bad.result(WAIT_S)
    assert good.result(WAIT_S).text == "good"
    expect_cancel(broker, bad.request_id)
    assert client.client.link_state().malformed == 1
    serves_the_next_request(client, broker)


def test_a_newer_workers_nested_fields_are_ignored(client, broker):
    # A newer worker adding one field inside usage was a TypeError that stopped every client.
    future = client.submit("x", logprobs=1)
    broker.submit(future.request_id)
    newer = {**completion(), "usage": {"prompt_tokens": 1, "completion_tokens": 2, "cached_tokens": 1},
             "logprobs": [[1, "a", -0.5, [[2, "b", -1.0, "later"]], "later"], [2, "b", 0, []]],
             "timings": {"total_s": 0.1, "phases": {"a": 1}}, "added": {"x": 1}}
    broker.send(raw(FINAL, {"request_id": future.request_id, "completion": newer, "added": 1}))
    done = future.result(WAIT_S)
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (1, 2)
    assert [(t.chosen.logprob, [x.token_id for x in t.top]) for t in done.logprobs] \
        == [(-0.5, [2]), (0.0, [])]
    assert done.timings == {"total_s": 0.1} and client.client.link_state().malformed == 0


def test_malformed_logprobs_in_a_partial_fail_only_that_stream(client, broker):
    bad, good = client.stream("bad", logprobs=1), client.stream("good", logprobs=1)
    broker.submit(bad.request_id)
    broker.submit(good.request_id)
    broker.send(raw(PARTIAL, {"request_id": bad.request_id, "index": 0, "token_id": 1, "text": "a",
                              "seq": 0, "logprobs": [[1, "a", -0.5]]}))  # no top list: an IndexError
    broker.send(Partial(good.request_id, 0, 1, "g", 0, [[1, "g", -0.5, []]]))
    broker.send(Final(good.request_id, completion("g"), partials=1))
    with pytest.raises(errors.MalformedMessageError, match=r"PARTIAL.logprobs\[0\] must be"):
        bad.result(WAIT_S)
    assert [d.text for d in good.result(WAIT_S)] == ["g"]
    expect_cancel(broker, bad.request_id)
    serves_the_next_request(client, broker)


def test_a_reply_that_does_not_decode_fails_the_request_it_names(client, broker):
    # Not left waiting for ever (no timeout): the body still says whose reply it was.
    bad, good = client.submit("bad"), client.submit("good")
    broker.submit(bad.request_id)
    broker.send(raw(FINAL, {"request_id": bad.request_id, "completion": completion(), "partials": "1"}))
    broker.send(raw(0x7F, {"request_id": good.request_id}))  # a command from a newer broker: dropped
    broker.answer(good.request_id, "good")
    with pytest.raises(errors.MalformedMessageError, match="Final.partials"):
        bad.result(WAIT_S)
    assert good.result(WAIT_S).text == "good" and client.client.link_state().malformed == 2
    serves_the_next_request(client, broker)


@pytest.mark.parametrize("prompt, sampling", [
    ("\ud800", {}), ([{"role": "user", "content": "\ud800"}], {}), ("x", {"model": "\ud800"}),
    ("x", {"max_tokens": 2**64}), ("x", {"top_k": 2**64}),
])
def test_a_request_that_cannot_be_encoded_fails_alone_at_submit(client, broker, prompt, sampling):
    good = client.submit("good")
    with pytest.raises(errors.InvalidRequestError):
        client.submit(prompt, **sampling).result(WAIT_S)  # refused by submit, or its future failed
    broker.answer(good.request_id, "good")
    assert good.result(WAIT_S).text == "good"
    serves_the_next_request(client, broker)
    assert len(broker.submitted()) == 2  # good's and the next one's: the broker never saw it


def test_an_unencodable_request_is_forgotten_so_never_resent(client, broker, monkeypatch):
    # Past make_submit's checks (any encoder error): the request fails and is untracked, so a PONG
    # naming it (the broker restarted and forgot) resends only the others.
    good = client.submit("good")
    real = __import__("ovpool.client_link", fromlist=["make_submit"]).make_submit
    monkeypatch.setattr("ovpool.client_link.make_submit",
                        lambda *a, **k: Submit(real(*a, **k).request_id, "", {"seed": 2**64}, "x"))
    bad = client.submit("bad")
    monkeypatch.undo()
    with pytest.raises(errors.InvalidRequestError, match=f"request {bad.request_id} cannot be encoded"):
        bad.result(WAIT_S)
    broker.submit(good.request_id)
    broker.send(Pong([bad.request_id, good.request_id]))
    broker.answer(good.request_id, "good")  # the resend
    assert good.result(WAIT_S).text == "good"
    serves_the_next_request(client, broker)
    assert bad.request_id not in broker.submitted()


def test_a_stopped_io_loop_fails_what_waits_and_every_later_call(client, broker, monkeypatch):
    waiting = client.submit("waits")
    broker.submit(waiting.request_id)

    def broken(now: float) -> list:
        raise RuntimeError("a bug")

    monkeypatch.setattr(client.client._link.pending, "tick", broken)  # the loop's periodic duty
    with pytest.raises(errors.BrokerUnavailableError, match=r"I/O loop stopped \(RuntimeError: a bug\)"):
        waiting.result(WAIT_S)
    state = client.client.link_state()
    assert not client.client.healthy and not state.reading and "RuntimeError: a bug" in state.stopped
    with pytest.raises(errors.BrokerUnavailableError, match="I/O loop stopped"):
        client.submit("later")


def test_link_state_says_what_a_health_check_needs(client, broker):
    assert client.client.healthy and client.client.link_state().heard_s is None  # nothing heard yet
    serves_the_next_request(client, broker)
    state = client.client.link_state()
    assert isinstance(state, LinkState) and state.reading and state.connected
    assert state.heard_s >= 0 and state.malformed == 0 and state.stopped == ""


def test_complete_never_waits_past_its_timeout_even_with_its_io_thread_stuck():
    with FakeBroker() as broker:
        client = DRIVERS["Client"](broker.endpoint).client
        gate = threading.Event()
        try:
            client._call(lambda now: gate.wait() and [])  # the I/O thread runs no deadline now
            with pytest.raises(errors.RequestTimeoutError, match="within its timeout of 0.2 s"):
                client.complete("x", timeout=0.2)
        finally:
            gate.set()
            client.close()
