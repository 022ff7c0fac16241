"""Fuzz a live broker with malformed frames and bodies while correct requests keep being served."""

from __future__ import annotations

import threading

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ovpool.client import Client
from ovpool.protocol import VERSION, Final, Partial, Ready, Submit, encode
from ovpool.testing.pool import broker, fast_heartbeats, free_endpoint, null_worker, wait_for_workers

# The served model has a name the fuzzer will not produce, so fuzzed READYs never steal its requests.
MODEL = "fuzz-target-model-7f3a"
_COMMANDS = [encode(m)[1] for m in (Submit("r", "m", {}), Partial("r", 0, 0, "", 0), Final("r", {}),
                                    Ready("w", ["m"], "CPU", 1, "h", 1))] + [bytes([b]) for b in range(40)]
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=10)
_bodies = st.one_of(
    st.binary(max_size=200),
    _values.map(msgpack.packb),
    st.fixed_dictionaries({}, optional={
        "request_id": _values, "model": st.just(MODEL) | _values, "params": _values, "prompt": _values,
        "messages": _values, "timeout_s": _values, "index": _values, "token_id": _values, "text": _values,
        "completion": _values, "models": _values, "slots": _values, "worker_id": _values,
    }).map(msgpack.packb),
)
_frames = st.one_of(
    st.lists(st.binary(max_size=40), max_size=6),
    st.tuples(st.just(VERSION) | st.binary(max_size=6), st.sampled_from(_COMMANDS), _bodies).map(list),
)


@pytest.mark.slow
def test_broker_survives_300_malformed_messages_and_keeps_serving(tmp_path):
    endpoint, log = free_endpoint(), tmp_path / "broker.log"
    with fast_heartbeats(0.2), broker(endpoint, log=log), null_worker(endpoint, model=MODEL, slots=4), \
            Client(endpoint) as client:
        wait_for_workers(client, 1)
        served, stop = [], threading.Event()

        def keep_serving():
            while not stop.is_set():
                served.append(client.complete("steady", model=MODEL, max_tokens=2, seed=1, timeout=30))

        server_thread = threading.Thread(target=keep_serving)
        server_thread.start()
        ctx = zmq.Context()
        fuzzer = ctx.socket(zmq.DEALER)
        fuzzer.linger = 0
        fuzzer.connect(endpoint)

        @settings(max_examples=300, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(_frames)
        def send_malformed(frames):
            if frames:
                fuzzer.send_multipart(frames)

        try:
            send_malformed()
        finally:
            stop.set()
            server_thread.join(timeout=60)
            fuzzer.close()
            ctx.term()
        final = client.complete("after", model=MODEL, max_tokens=3)
        status = client.status()
    assert len(served) >= 5 and all(c.token_ids == served[0].token_ids for c in served)
    assert final.usage.completion_tokens == 3
    assert status["counters"]["malformed"] >= 100
    assert "Traceback" not in log.read_text()  # no input reached a routing bug
