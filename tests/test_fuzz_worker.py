"""Fuzz a worker's message handling: random msgpack bodies for every broker -> worker command
(REQUEST, CANCEL, CREDIT, HEARTBEAT, DISCONNECT) and garbage frames, from a hand-driven broker
socket into the worker loop (null backend). After each example the next valid REQUEST is served,
and no message reached a bug (nothing logged at ERROR)."""

from __future__ import annotations

import logging
import threading

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_worker_process import HandBroker

from ovpool.protocol import (
    VERSION,
    Cancel,
    Credit,
    Disconnect,
    Error,
    Final,
    Heartbeat,
    Partial,
    Request,
    encode,
)
from ovpool.worker.null_backend import NullBackend
from ovpool.worker.process import Worker

_COMMANDS = [encode(m)[1] for m in (Request("r", "m", {}), Cancel("r"), Credit("", 1), Heartbeat(),
                                    Disconnect())] + [bytes([b]) for b in range(24)]
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=10)
_SAMPLING = ["max_tokens", "temperature", "top_k", "top_p", "seed", "stop", "ignore_eos", "min_p",
             "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs",
             "response_format"]
_params = st.dictionaries(st.sampled_from(_SAMPLING), _values, max_size=5) | _values
_bodies = st.one_of(
    st.binary(max_size=200),
    _values.map(msgpack.packb),
    st.fixed_dictionaries({}, optional={
        "request_id": st.text(max_size=8) | _values, "model": st.just("m") | _values, "params": _params,
        "prompt": st.text(max_size=40) | _values, "messages": _values, "route_keys": _values,
        "tokens": _values, "request_ids": _values, "held": _values, "prompt_tokens": _values,
    }).map(lambda body: msgpack.packb(body, default=repr)),
)
_ids = st.sampled_from(["a", "b", "valid-0"]) | st.text(max_size=8)
# Well-formed envelopes (each field of its wire type) with hostile values inside, so that the
# fuzz reaches the worker's handling and not only the decoder.
_typed = st.one_of(
    st.fixed_dictionaries({"request_id": _ids, "model": st.just("m"), "params": _params.filter(
        lambda p: isinstance(p, dict))}, optional={
        "prompt": st.text(max_size=40), "messages": st.lists(_values, max_size=3),
        "route_keys": st.lists(st.binary(min_size=16, max_size=16) | _values, max_size=3)}).map(
        lambda body: (_COMMANDS[0], body)),
    st.fixed_dictionaries({"request_id": _ids}).map(lambda body: (_COMMANDS[1], body)),
    st.fixed_dictionaries({"request_id": st.just(""), "tokens": st.integers(-2**63, 2**63 - 1)}).map(
        lambda body: (_COMMANDS[2], body)),
    st.fixed_dictionaries({}, optional={"request_ids": st.lists(_ids, max_size=3)}).map(
        lambda body: (_COMMANDS[4], body)),
).map(lambda cmd_body: [VERSION, cmd_body[0], msgpack.packb(cmd_body[1], default=repr)])
_frames = st.one_of(
    st.lists(st.binary(max_size=40), min_size=1, max_size=5),
    st.tuples(st.just(VERSION) | st.binary(max_size=6), st.sampled_from(_COMMANDS), _bodies).map(list),
    _typed,
)


def served(hand: HandBroker, rid: str) -> bool:
    """Reset the worker (DISCONNECT drops what the fuzz started), then one request to its FINAL,
    returning credit for every reply as a broker does."""
    hand.send(Disconnect())
    hand.send(Request(rid, "m", {"max_tokens": 2, "seed": 1}, prompt="steady"))
    while True:
        msg = hand.next()
        if isinstance(msg, Partial | Final | Error):
            hand.send(Credit("", 1))
        if getattr(msg, "request_id", None) == rid:
            if isinstance(msg, Final | Error):
                return isinstance(msg, Final)


def test_no_message_stops_the_worker_and_the_next_request_is_served(tmp_path, caplog):
    hand = HandBroker(f"ipc://{tmp_path}/broker")
    stop = threading.Event()
    worker = Worker(f"ipc://{tmp_path}/broker", NullBackend(["m"], slots=4), name="w")
    thread = threading.Thread(target=lambda: worker.__enter__().run(stop))
    thread.start()
    hand.next()  # READY
    count = iter(range(10**6))

    @settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(_frames, min_size=1, max_size=3))
    def fuzz(messages):
        for frames in messages:
            hand.send_frames(frames)
        assert served(hand, f"valid-{next(count)}")

    try:
        with caplog.at_level(logging.WARNING, logger="ovpool"):
            fuzz()
    finally:
        stop.set()
        thread.join()
        worker.__exit__(None, None, None)
        hand.close()
    assert thread.is_alive() is False
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[-2000:]
