"""Fuzz the broker's routing core: random msgpack bodies for every wire command, from client and
worker peers, through protocol.decode into Router.handle (and the metrics observer, as the
broker loop runs them), with timers between. Nothing may raise, what the router holds stays
within its bounds, and afterwards a valid SUBMIT from a fresh client is dispatched."""

from __future__ import annotations

import dataclasses

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ovpool import errors, protocol, timing
from ovpool.broker import bounds
from ovpool.broker.metrics import BrokerMetrics, BrokerObserver
from ovpool.broker.router import Router
from ovpool.errors import ProtocolError
from ovpool.protocol import (
    VERSION,
    Cancel,
    Credit,
    Disconnect,
    Error,
    Final,
    Heartbeat,
    LoadFailed,
    Partial,
    Pong,
    Ready,
    Request,
    Shutdown,
    StatusReply,
    Submit,
)
from ovpool.sampling_params import SamplingParams

# The served model has a name the fuzzer does not produce, so no fuzzed READY serves it.
MODEL = "fuzz-target-model-7f3a"
GOOD, FRESH = b"good-worker", b"fresh-client"
PEERS = [b"client-a", b"client-b", b"worker-a", b"worker-b"]
COMMANDS = list(protocol.Message.__args__)  # every wire command

_ids = st.sampled_from(["r1", "r2", "r3", "r4", "r5", ""])
_names = st.sampled_from(["", "m", "CPU", "h", "w@h:1", "failing"]) | st.text(max_size=12)
_ints = st.sampled_from([0, 1, 2, 3, 10**9]) | st.integers(-2**63, 2**64 - 1)
_values = st.recursive(
    st.none() | st.booleans() | _ints | st.floats() | _names | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_names, inner, max_size=3),
    max_leaves=6)
_chat = st.lists(st.dictionaries(st.sampled_from(["role", "content"]) | _names, _names | _values, max_size=3),
                 max_size=3)
_BY_TYPE = {"str": _ids | _names, "int": _ints, "float": st.floats() | _ints,
            "dict": st.dictionaries(_names, _values, max_size=4),
            "list": st.lists(_ids | _names | _values, max_size=6),
            "str | None": st.none() | _names, "list | None": st.none() | _chat,
            "float | None": st.none() | st.floats() | _ints}
_formats = st.fixed_dictionaries({"type": st.sampled_from(["json_schema", "regex", "grammar", "text"])},
                                 optional={"schema": _values, "pattern": _values, "lark": _values})
_sampling = st.fixed_dictionaries({"max_tokens": st.integers(1, 80)}, optional={
    "seed": st.none() | st.integers(0, 9), "temperature": st.sampled_from([0.0, 1.0]),
    "stop": st.lists(_names, max_size=2), "logprobs": st.none() | st.integers(0, 3),
    "response_format": _formats})
_any_sampling = st.dictionaries(
    st.sampled_from([f.name for f in dataclasses.fields(SamplingParams)]) | _names, _values, max_size=4)
# Fields whose values the router looks at get values near the ones it acts on.
_BY_NAME = {
    "request_id": _ids, "model": st.sampled_from(["", "m", MODEL]) | _names,
    "params": _sampling | _any_sampling,
    "prompt": st.just("hi") | st.none() | _names, "messages": st.none() | _chat,
    "models": st.lists(st.sampled_from(["m", "x"]) | _names, max_size=3),
    "slots": st.sampled_from([1, 2, 10**9]) | _ints, "seq": st.integers(0, 3) | _ints,
    "window": st.sampled_from([0, 1, 10**9]) | _ints, "tokens": st.sampled_from([1, 10**9]) | _ints,
    "timeout_s": st.sampled_from([0.0, 1.0]) | st.floats()}


def _body(cls: type) -> st.SearchStrategy[bytes]:
    """Mostly a body of the command's fields with values of their types (so that it decodes and
    reaches the router), else one with a field dropped, replaced or added at random."""
    fields = dataclasses.fields(cls)
    required = {f.name: _BY_NAME.get(f.name, _BY_TYPE[f.type]) for f in fields if f.name == "prompt"
                or f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    optional = {f.name: _BY_NAME.get(f.name, _BY_TYPE[f.type]) for f in fields if f.name not in required}
    typed = st.fixed_dictionaries(required, optional=optional)
    keys = _names | st.sampled_from([f.name for f in fields] or ["x"])
    mutated = st.tuples(typed, keys, st.none() | _values).map(
        lambda t: {k: v for k, v in {**t[0], t[1]: t[2]}.items() if v is not None})
    return st.one_of(typed, typed, mutated).map(msgpack.packb)


def _commands(classes: list[type]) -> st.SearchStrategy[list[bytes]]:
    return st.sampled_from(classes).flatmap(lambda cls: _body(cls).map(
        lambda body: [VERSION, bytes([cls.command]), body]))


_accepted = _commands([c for c in COMMANDS if c not in (Pong, Shutdown, StatusReply, Request)])
_frames = st.one_of(
    _accepted, _accepted, _accepted, _accepted, _accepted, _accepted,
    _commands([Pong, Shutdown, StatusReply, Request]),  # what only the broker sends
    st.lists(st.binary(max_size=12), max_size=4),
    st.tuples(st.just(VERSION), st.binary(min_size=1, max_size=2), st.binary(max_size=30)).map(list),
)
_message = st.tuples(st.sampled_from(PEERS), _frames)
_clients, _workers = st.sampled_from(PEERS[:2]), st.sampled_from(PEERS[2:])


def _submit(rid: str, model: str, window: int, max_tokens: int) -> Submit:
    return Submit(rid, model, {"max_tokens": max_tokens}, prompt="hi", window=window)


def _ready(models: list, slots: int) -> Ready:
    return Ready("f@h:3", models, "CPU", slots, "h", 3)


# Well-formed traffic around the same request ids, so that fuzzed messages meet live requests.
_traffic = st.tuples(_clients, st.one_of(
    st.builds(_submit, _ids, st.sampled_from(["m", MODEL, ""]), st.sampled_from([0, 1, 4, 10**9]),
              st.integers(1, 64)),
    st.builds(Credit, _ids, st.sampled_from([1, 10**9])),
    st.builds(Cancel, _ids))) | st.tuples(_workers, st.one_of(
        st.builds(lambda rid, seq: Partial(rid, seq, seq, "x", seq), _ids, st.integers(0, 70)),
        st.builds(lambda rid, usage: Final(rid, {"text": "x", "usage": usage}), _ids, _values),
        st.builds(lambda rid: Error(rid, "inference", "boom"), _ids),
        st.builds(Heartbeat, st.lists(st.binary(min_size=16, max_size=16))),
        st.builds(_ready, st.lists(st.sampled_from(["m", "x"]), min_size=1, max_size=2),
                  st.sampled_from([1, 10**9])),
        st.builds(Disconnect, st.lists(_ids, max_size=2)),
        st.just(LoadFailed("g@h:4", ["m"], "CPU", "h", 4, "model", "no"))))
_steps = st.sampled_from([0.0, 0.5, 5.0, 100.0])  # between timer rounds, one per example


class Loop:
    """What the broker loop does with each message, its replies and its timers (broker/server.py)."""

    def __init__(self) -> None:
        self.router = Router(now=0.0, queue_limit=4, max_new_tokens=64, stream_stall_s=5.0,
                             progress_timeout_s=10.0)
        self.observer = BrokerObserver(BrokerMetrics())
        self.now = 0.0

    def receive(self, peer: bytes, frames: list[bytes]) -> list:
        try:
            msg = protocol.decode(frames)
        except ProtocolError as exc:
            return self._sent(self.router.malformed(peer, exc))
        self.observer.incoming(msg, self.now)
        return self._sent(self.router.handle(peer, msg, self.now))

    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.receive(GOOD, protocol.encode(Heartbeat()))
        self._sent(self.router.tick(self.now))
        workers = self.router.workers.values()
        self.observer.tick(self.router.queues, [(len(w.inflight), w.info.slots) for w in workers],
                           self.router.supervised.entries())

    def _sent(self, out: list) -> list:
        for _, msg in out:
            protocol.encode(msg)  # everything the broker sends can be sent
            self.observer.outgoing(msg, self.now)
        return out


def _bounded(r: Router) -> None:
    assert len(r.workers) <= bounds.MAX_WORKERS and len(r.jobs) <= 4 * 8 + 64
    assert all(len(w.inflight) <= w.cap <= min(w.info.slots, bounds.MAX_SLOTS) for w in r.workers.values())
    assert r.streams.held() <= len(r.streams) * 64 and len(r.failures) <= 1000 and len(r.supervised) <= 1000
    assert all(len(w.info.models) <= bounds.MAX_NAMES for w in r.workers.values())


def _run(events: list, step: float) -> None:
    """The events into a loop serving MODEL on GOOD (and "m" on a fuzzed worker), timers every
    few messages; then a valid SUBMIT from a fresh client must be dispatched."""
    loop = Loop()
    loop.receive(GOOD, protocol.encode(Ready("good@h:1", [MODEL], "CPU", 2, "h", 1)))
    loop.receive(b"worker-a", protocol.encode(Ready("a@h:2", ["m"], "CPU", 2, "h", 2)))  # fuzzed from now on
    for i, (peer, frames) in enumerate(events):
        loop.receive(peer, frames)
        if i % 4 == 3:
            loop.tick(step)
        _bounded(loop.router)
    loop.tick(timing.CLIENT_UNAVAILABLE_S + 1)  # the fuzzing clients went silent: their requests end
    # GOOD never answers: if a request stalled there it draws no more, so a second worker registers.
    loop.receive(b"good-worker-2", protocol.encode(Ready("good@h:5", [MODEL], "CPU", 1, "h", 5)))
    out = loop.receive(FRESH, protocol.encode(Submit("fresh", MODEL, {"max_tokens": 2}, prompt="hi")))
    if loop.router.drain is not None:  # a fuzzed DRAIN of the pool: refused, retryable, said so
        assert [(type(m), m.code) for _, m in out] == [(Error, errors.DrainingError.code)]
        return
    assert [type(m) for _, m in out] == [Request] and out[0][0] in (GOOD, b"good-worker-2")


_FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@_FUZZ
@given(st.lists(_message, min_size=5, max_size=40), _steps)
def test_random_bodies_of_every_command_neither_raise_nor_grow_the_router(events, step):
    _run(events, step)


@_FUZZ
@given(st.lists(_traffic.map(lambda t: (t[0], protocol.encode(t[1]))) | _message, min_size=10, max_size=50),
       _steps)
def test_fuzzed_messages_among_live_requests_neither_raise_nor_grow_the_router(events, step):
    _run(events, step)
