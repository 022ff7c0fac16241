"""The worker process's message handling, with the test as its broker: a ROUTER socket driven by
hand on a private ipc endpoint, the worker loop on a thread with the null backend. No broker
process, no model: every message the worker sends is read and checked."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from ovpool import errors, timing
from ovpool.prefix_key import after_answer, route_keys
from ovpool.protocol import (
    Cancel,
    Disconnect,
    Error,
    Final,
    Heartbeat,
    Message,
    Partial,
    Ready,
    Request,
    decode,
    encode,
)
from ovpool.worker.null_backend import NullBackend
from ovpool.worker.process import Worker

WAIT_MS = 10_000  # a bound on a reply that comes at once: reached only if the worker is broken


class HandBroker:
    """The broker end of one worker: ``send`` a message, ``next`` the worker's next one (no heartbeats)."""

    def __init__(self, endpoint: str):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.bind(endpoint)
        self.worker = b""

    def next(self) -> Message:
        while True:
            assert self.socket.poll(WAIT_MS), "the worker sent nothing"
            self.worker, *frames = self.socket.recv_multipart()
            msg = decode(frames)
            if not isinstance(msg, Heartbeat):
                return msg

    def until(self, cls: type, request_id: str) -> list[Message]:
        """Every message up to and including the first ``cls`` about ``request_id``."""
        seen = []
        while not (seen and isinstance(seen[-1], cls) and seen[-1].request_id == request_id):
            seen.append(self.next())
        return seen

    def send(self, msg: Message) -> None:
        self.socket.send_multipart([self.worker, *encode(msg)])

    def send_frames(self, frames: list[bytes]) -> None:
        self.socket.send_multipart([self.worker, *frames])

    def close(self) -> None:
        self.socket.close()
        self.context.term()


@pytest.fixture
def broker(tmp_path) -> Iterator[HandBroker]:
    hand = HandBroker(f"ipc://{tmp_path}/broker")
    yield hand
    hand.close()


@pytest.fixture
def serving(broker, tmp_path):
    """Start a worker (null backend, 2 slots, one token per 5 ms) against ``broker``; returns the
    READY it sent and a function that stops it and returns what it said last."""
    stop = threading.Event()

    def run() -> None:
        backend = NullBackend(["m"], slots=2, token_delay_s=0.005)
        with Worker(f"ipc://{tmp_path}/broker", backend, name="w") as worker:
            worker.run(stop)

    thread = threading.Thread(target=run)
    thread.start()
    ready = broker.next()

    def stop_worker() -> Message:
        stop.set()
        thread.join(WAIT_MS / 1000)
        assert not thread.is_alive()
        return broker.next()

    yield ready, stop_worker
    if thread.is_alive():
        stop.set()
        thread.join()


def request(rid: str, max_tokens: int = 3, **params) -> Request:
    return Request(rid, "m", {"max_tokens": max_tokens, "seed": 1, **params}, prompt="hello there")


def serves_on(broker: HandBroker) -> None:
    broker.send(request("next", max_tokens=1))
    assert isinstance(broker.until(Final, "next")[-1], Final)


def test_a_request_streams_each_token_once_in_order_then_its_final(broker, serving):
    ready, stop = serving
    assert isinstance(ready, Ready) and ready.models == ["m"] and ready.slots == 2
    broker.send(request("a", max_tokens=5))
    *partials, final = broker.until(Final, "a")
    assert all(isinstance(p, Partial) for p in partials)
    assert [(p.request_id, p.index) for p in partials] == [("a", i) for i in range(5)]
    assert final.completion["text"] == "".join(p.text for p in partials)
    assert final.completion["finish_reason"] == "length"
    assert stop() == Disconnect([])  # nothing left unfinished


def test_bad_parameters_are_an_error_naming_them_and_the_worker_serves_on(broker, serving):
    _, stop = serving
    broker.send(request("bad", temperature="hot"))
    err = broker.next()
    assert isinstance(err, Error) and err.request_id == "bad"
    assert err.code == errors.InvalidRequestError.code and "temperature" in err.message
    serves_on(broker)
    stop()


def test_a_cancelled_request_stops_before_the_next_message_is_handled(broker, serving):
    _, stop = serving
    broker.send(request("long", max_tokens=100_000))
    assert broker.next().request_id == "long"  # running
    broker.send(Cancel("long"))
    broker.send(request("after", max_tokens=2))
    seen = broker.until(Final, "after")
    first_after = next(i for i, m in enumerate(seen) if m.request_id == "after")
    assert all(m.request_id == "after" for m in seen[first_after:])  # in order: cancel came first
    assert not any(isinstance(m, Final) and m.request_id == "long" for m in seen)
    assert stop() == Disconnect([])


def test_a_broker_that_asks_again_gets_a_new_ready_and_the_sessions_are_dropped(broker, serving):
    ready, stop = serving
    broker.send(request("dropped", max_tokens=100_000))
    assert broker.next().request_id == "dropped"
    broker.send(Disconnect())
    again = next(m for m in iter(broker.next, None) if isinstance(m, Ready))
    assert again == ready
    assert stop() == Disconnect([])  # the dropped request is no longer the worker's


def test_a_frame_that_does_not_decode_is_dropped_and_the_worker_serves_on(broker, serving):
    _, stop = serving
    broker.send_frames([b"\xff\xfe not a message"])
    serves_on(broker)
    stop()


def test_stopping_hands_unfinished_requests_back(broker, serving):
    _, stop = serving
    broker.send(request("one", max_tokens=100_000))
    broker.send(request("two", max_tokens=100_000))
    running: set[str] = set()
    while running != {"one", "two"}:
        running.add(broker.next().request_id)
    last = stop()
    while not isinstance(last, Disconnect):
        last = broker.next()
    assert sorted(last.request_ids) == ["one", "two"]


def test_heartbeats_report_the_route_keys_of_finished_chats(broker, serving):
    _, stop = serving
    messages = [{"role": "user", "content": "hello there"}]
    keys = route_keys("m", messages=messages).keys
    broker.send(Request("c", "m", {"max_tokens": 2, "seed": 1}, None, messages, list(keys)))
    final = broker.until(Final, "c")[-1]
    answer = after_answer("m", None, messages, final.completion["text"]).keys[-1]
    while True:  # the next heartbeat after the FINAL (one per heartbeat interval)
        assert broker.socket.poll(WAIT_MS), "the worker sent nothing"
        _, *frames = broker.socket.recv_multipart()
        msg = decode(frames)
        if isinstance(msg, Heartbeat):
            break
    assert msg.held == [answer, keys[0]] and msg.prompt_tokens == 2
    stop()


def test_malformed_route_keys_are_an_error_and_the_worker_serves_on(broker, serving):
    _, stop = serving
    broker.send(Request("k", "m", {"max_tokens": 1, "seed": 1}, "hi", None, [b"short"]))
    err = broker.next()
    assert isinstance(err, Error) and err.request_id == "k" and "route keys" in err.message
    serves_on(broker)
    stop()


class _CountsIdle(NullBackend):
    def __init__(self):
        super().__init__(["m"], slots=2)
        self.idle_calls = 0

    def idle(self) -> bool:
        self.idle_calls += 1
        return False  # done for this idle period


class _NoIdleWork(_CountsIdle):
    def idle(self) -> None:
        self.idle_calls += 1  # None: no idle work at all


@pytest.mark.parametrize(("backend_type", "calls"), [(_CountsIdle, 2), (_NoIdleWork, 1)])
def test_idle_work_runs_once_per_idle_period_unless_there_is_none(broker, tmp_path, backend_type, calls):
    backend, stop = backend_type(), threading.Event()
    with Worker(f"ipc://{tmp_path}/broker", backend, name="w") as worker:
        thread = threading.Thread(target=worker.run, args=(stop,))
        thread.start()
        try:
            broker.next()  # READY
            _wait(lambda: backend.idle_calls >= 1)
            serves_on(broker)
            _wait(lambda: backend.idle_calls >= calls)
            time.sleep(5 * timing.POLL_INTERVAL_S)  # the loop wakes 5 times with nothing to do
            assert backend.idle_calls == calls
        finally:
            stop.set()
            thread.join()


def _wait(predicate) -> None:
    deadline = time.monotonic() + WAIT_MS / 1000
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
