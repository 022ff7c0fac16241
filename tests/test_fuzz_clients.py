"""Issue 24: random bodies for every broker → client command (and random command bytes and frames)
fed to both clients. Each message may fail the requests it names, never more: both requests it
could name end (a result or an ovpool error, none left waiting), and a new request succeeds."""

from __future__ import annotations

import pytest
from fake_broker import DRIVERS, FakeBroker, completion, raw
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ovpool import errors
from ovpool.protocol import VERSION, Error, Final, Partial, Pong, Shutdown, StatusReply

WAIT_S = 10  # a bound for an answer already on its way, never a timing assumption
REPLIES = [Partial, Final, Error, StatusReply, Pong, Shutdown]
# Stand-ins for the ids of the example's two requests: a message is drawn before they are sent, so
# that no example can end (hypothesis stops one whose draw overruns) with a request left waiting.
FUTURE, STREAM = "<future>", "<stream>"

junk = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8)


def shaped(good: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly a value of the right shape, sometimes anything."""
    return st.one_of(good, good, good, junk)


def entry(extra: st.SearchStrategy | None = None) -> st.SearchStrategy:
    """A ``[id, text, logprob, ...]`` log-probability, perhaps with ``extra`` items after it."""
    base = st.tuples(shaped(st.integers(0, 9)), shaped(st.text(max_size=3)), shaped(st.floats()))
    tail = st.just([]) if extra is None else st.lists(extra, max_size=2)
    return st.tuples(base, tail).map(lambda t: [*t[0], *t[1]])


logprobs = shaped(st.lists(shaped(entry(shaped(st.lists(shaped(entry()), max_size=2)))), max_size=2))
numbers = st.floats() | st.integers(0, 9)


def body(fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """A map with any of ``fields`` (each mostly well-shaped) and perhaps a newer peer's extra key."""
    return st.fixed_dictionaries({}, optional={**{k: shaped(v) for k, v in fields.items()}, "added": junk})


def completions() -> st.SearchStrategy:
    usage = body({"prompt_tokens": st.integers(0, 9), "completion_tokens": st.integers(0, 9)})
    return body({"text": st.text(max_size=4), "token_ids": st.lists(st.integers(0, 9), max_size=3),
                 "finish_reason": st.sampled_from(["stop", "length"]), "usage": usage,
                 "timings": st.dictionaries(st.text(max_size=6), numbers, max_size=2),
                 "logprobs": st.none() | logprobs, "note": st.text(max_size=4)})


def bodies() -> dict[type, st.SearchStrategy]:
    rid = st.sampled_from([FUTURE, STREAM, ""]) | st.text(max_size=4)
    return {
        Partial: body({"request_id": rid, "index": st.integers(0, 9), "token_id": st.integers(0, 9),
                       "text": st.text(max_size=4), "seq": st.integers(0, 2), "logprobs": logprobs}),
        Final: body({"request_id": rid, "completion": completions(), "partials": st.integers(0, 2)}),
        Error: body({"request_id": rid, "code": st.sampled_from(["request.timeout", "request.x", "?"]),
                     "message": st.text(max_size=8)}),
        StatusReply: body({"status": st.dictionaries(st.text(max_size=6), junk, max_size=3)}),
        Pong: body({"unknown": st.lists(shaped(rid), max_size=3)}),
        Shutdown: body({"reason": st.text(max_size=8)}),
    }


def messages() -> st.SearchStrategy:
    """One message: (command byte, body) for a reply command with a random body or a random
    command byte, else random frames."""
    known = st.sampled_from(REPLIES).flatmap(lambda cls: st.tuples(st.just(cls.command), bodies()[cls]))
    any_command = st.tuples(st.integers(0, 255), junk)
    garbage = st.lists(st.binary(max_size=12), min_size=1, max_size=4) \
        | st.tuples(st.sampled_from(REPLIES), st.binary(max_size=12)).map(
            lambda t: [VERSION, bytes([t[0].command]), t[1]])
    return st.one_of(known, known, known, any_command, garbage)


def frames(message: tuple | list, ids: dict[str, str]) -> list[bytes]:
    """``message``'s frames, with the stand-ins in its body replaced by the requests' ids."""
    return raw(message[0], resolved(message[1], ids)) if isinstance(message, tuple) else message


def resolved(value: object, ids: dict[str, str]) -> object:
    if isinstance(value, str):
        return ids.get(value, value)
    if isinstance(value, list):
        return [resolved(v, ids) for v in value]
    if isinstance(value, dict):
        return {k: resolved(v, ids) for k, v in value.items()}
    return value


@pytest.fixture(scope="module", params=list(DRIVERS))
def pool(request):
    with FakeBroker() as broker:
        driver = DRIVERS[request.param](broker.endpoint)
        yield driver, broker
        driver.close()


def ended(future) -> None:
    """The request's result or its error; a TimeoutError (a request left waiting) fails the test."""
    try:
        future.result(WAIT_S)
    except errors.OvpoolError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=messages())
def test_a_random_reply_fails_at_most_the_requests_it_names(pool, message):
    client, broker = pool
    future, stream = client.submit("a"), client.stream("s", logprobs=1)
    broker.submit(future.request_id)
    broker.submit(stream.request_id)
    broker.send(frames(message, {FUTURE: future.request_id, STREAM: stream.request_id}))
    broker.send(Partial(stream.request_id, 0, 1, "s", 0, [[1, "s", -0.5, []]]))
    broker.send(Final(stream.request_id, completion(), partials=1))
    broker.send(Final(future.request_id, completion()))
    ended(future)
    ended(stream)
    after = client.submit("next")
    broker.answer(after.request_id, "next")
    assert after.result(WAIT_S).text == "next" and client.client.healthy
