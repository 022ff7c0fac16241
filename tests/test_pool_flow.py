"""Flow control end to end (issue 18), with real processes: every accepted token reaches its client
exactly once, or the client gets a clear error; never a silent hole.

The expected tokens come from NullBackend itself (same seed and prompt, same tokens), so "exactly
once" is checked token by token: every index, in order, with the right token id.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from ovpool import errors
from ovpool.async_client import AsyncClient
from ovpool.cache.store import PAUSE_ENV
from ovpool.client import Client, dealer
from ovpool.protocol import (
    Error,
    Final,
    Heartbeat,
    Partial,
    Ready,
    Request,
    Submit,
    decode,
    encode,
    recv_frames,
    send_frames,
)
from ovpool.sampling_params import SamplingParams
from ovpool.settings import Settings
from ovpool.submit import make_submit
from ovpool.testing.pool import broker, fast_heartbeats, free_endpoint, null_worker, wait_for_workers
from ovpool.worker.backend import Token
from ovpool.worker.null_backend import NullBackend

pytestmark = pytest.mark.slow  # several processes per test


@pytest.fixture
def endpoint():
    return free_endpoint()


def expected(prompt: str, seed: int, n: int) -> list[int]:
    """The token ids a null worker streams for ``prompt`` with ``seed``."""
    backend = NullBackend(slots=1)
    backend.add("r", prompt, SamplingParams(max_tokens=n, seed=seed))
    ids: list[int] = []
    while backend.active:
        ids += [ev.delta.token_id for ev in backend.step() if isinstance(ev, Token)]
    return ids


def stream_all(client: Client, n_streams: int, n_tokens: int) -> list[list | Exception]:
    """``n_streams`` streams at once, one reader thread each; each one's deltas or its error."""
    results: list = [None] * n_streams

    def read(i: int) -> None:
        try:
            results[i] = [(d.index, d.token_id) for d in client.stream(f"p{i}", max_tokens=n_tokens, seed=i)]
        except errors.OvpoolError as exc:
            results[i] = exc

    threads = [threading.Thread(target=read, args=(i,)) for i in range(n_streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def assert_exactly_once(results: list, n_tokens: int) -> None:
    for i, got in enumerate(results):
        assert not isinstance(got, Exception), f"stream {i} failed: {got!r}"
        assert [index for index, _ in got] == list(range(n_tokens)), f"stream {i}: {len(got)} tokens"
        assert [token for _, token in got] == expected(f"p{i}", i, n_tokens), f"stream {i}: wrong tokens"


@pytest.mark.parametrize("slots, n_streams, n_tokens", [(8, 8, 4000), (64, 64, 1500)])
def test_d1_a_fast_worker_loses_no_token(endpoint, slots, n_streams, n_tokens):
    """D1: a worker with no token delay outruns the broker; it used to drop what did not fit its
    send queue (streams 'ended normally' with ~3,920 of 4,000 tokens)."""
    with broker(endpoint), null_worker(endpoint, slots=slots), Client(endpoint) as client:
        wait_for_workers(client, 1)
        results = stream_all(client, n_streams, n_tokens)
        status = client.status()
    assert_exactly_once(results, n_tokens)
    assert status["counters"]["completed"] == n_streams and status["in_flight"] == 0


def test_d1_every_short_request_of_a_flood_resolves(endpoint):
    """D1: 4,000 short requests on 128 slots: 41 FINALs used to be dropped (futures never
    resolved, slots stayed held)."""
    with broker(endpoint, "--queue-limit", "4000"), null_worker(endpoint, slots=128), \
            Client(endpoint) as client:
        wait_for_workers(client, 1)
        futures = [client.submit(f"p{i}", max_tokens=32, seed=i) for i in range(4000)]
        results = [f.result(timeout=120) for f in futures]
        status = client.status()
    assert all(r.token_ids == expected(f"p{i}", i, 32) for i, r in enumerate(results))
    assert status["counters"]["completed"] == 4000 and status["in_flight"] == 0
    assert status["workers"][0]["active"] == 0


def test_d3_a_busy_client_stays_alive_and_answers(endpoint):
    """D3: one Client, 200 streams x 4,000 tokens: its I/O loop used to read for as long as tokens
    came, sending no PING (40 streams cancelled as 'client went silent'; status() took 32 s).
    Heartbeats at half the default halve the silence limit (CLIENT_UNAVAILABLE_S), so half the
    tokens flood for as many silence limits as the original scenario did."""
    with fast_heartbeats(0.5), broker(endpoint), null_worker(endpoint, slots=200), \
            Client(endpoint) as client:
        wait_for_workers(client, 1)
        results: list = []
        reader = threading.Thread(target=lambda: results.extend(stream_all(client, 200, 2000)))
        reader.start()
        while reader.is_alive():  # commands go out and replies come back while tokens flood in
            client.status(timeout=30.0)  # it waits behind at most the streams' credit
            reader.join(0.5)
        status = client.status()
    assert_exactly_once(results, 2000)
    assert status["counters"]["cancelled"] == 0 and status["counters"]["completed"] == 200


def paused_reader(endpoint: str, streams: int, tokens: int, pause_s: float) -> list:
    """tests/flow_reader.py's results after its whole process was stopped for ``pause_s`` mid-stream."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("flow_reader.py")), endpoint,
                             str(streams), str(tokens)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "STARTED"
        proc.send_signal(signal.SIGSTOP)
        time.sleep(pause_s)  # the scenario itself: a reader that reads nothing for this long
        proc.send_signal(signal.SIGCONT)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    return json.loads(out)


def test_d2_a_client_paused_10_s_gets_every_token_once(endpoint):
    """D2: a Client whose process was paused 10 s used to see its 64 streams 'end normally' with
    holes (the broker's ROUTER dropped at its high-water mark; index 250 jumped to 2,640). The
    broker now holds what the stream's credit does not cover, and sends it when the reader is back."""
    with broker(endpoint), null_worker(endpoint, slots=64), Client(endpoint) as client:
        wait_for_workers(client, 1)
        results = paused_reader(endpoint, 64, 4000, pause_s=10.0)
        status = client.status()
    assert_exactly_once([[tuple(pair) for pair in r] if isinstance(r, list) else Exception(r)
                         for r in results], 4000)
    assert status["streams"] == {"open": 0, "held": 0}


def test_d2_a_reader_that_stops_past_the_bounds_gets_an_end_for_every_request(endpoint):
    """D2: a raw DEALER that read nothing for 30 s while 200 x 2,000 tokens streamed: 104 requests
    got neither FINAL nor ERROR. Here the bound is a setting shortened for the test
    (stream_stall_s=3 instead of 30) and the reader pauses past it: every request ends with FINAL
    or a clear ERROR, after a gap-free prefix of its tokens."""
    with fast_heartbeats(0.5), broker(endpoint, "--set", "stream_stall_s=3"), \
            null_worker(endpoint, slots=200), Client(endpoint) as client:
        wait_for_workers(client, 1)
        context = zmq.Context()
        sock = dealer(context, endpoint, Settings.coerce(None))
        try:
            ids = []
            for i in range(200):
                submit = make_submit(f"p{i}", "", None, {"max_tokens": 2000, "seed": i}, window=256)
                send_frames(sock, encode(submit))
                ids.append(submit.request_id)
            time.sleep(4.0)  # reads nothing, sends nothing (no PING, no CREDIT)
            seqs, ends = {rid: [] for rid in ids}, {}
            while len(ends) < len(ids) and sock.poll(20_000):
                msg = decode(recv_frames(sock))
                if isinstance(msg, Partial):
                    seqs[msg.request_id].append(msg.seq)
                else:
                    assert msg.request_id not in ends, f"two ends for {msg.request_id}"
                    ends[msg.request_id] = msg
        finally:
            sock.close(linger=0)
            context.term()
        status = client.status()
    assert len(ends) == 200, f"{200 - len(ends)} requests got neither FINAL nor ERROR"
    for rid in ids:
        assert seqs[rid] == list(range(len(seqs[rid]))), f"{rid}: a hole or a repeat"
        end = ends[rid]
        if isinstance(end, Final):
            assert len(seqs[rid]) == 2000
        else:
            assert end.code in (errors.ClientTooSlowError.code, errors.CancelledError.code), end
    assert status["streams"] == {"open": 0, "held": 0} and status["in_flight"] == 0


def test_d4_a_message_over_the_limit_is_refused_with_the_limit_named(endpoint):
    """D4: a 70 MB prompt used to hang the client for ever (libzmq dropped the connection, the
    client resent it once a second). The client now refuses it before sending; the broker answers
    one sent anyway, and keeps serving. (Prompts and chats are capped at 2**20 characters now,
    far below the message limit: the client names that cap.)"""
    prompt = "x" * 70_000_000
    with broker(endpoint), null_worker(endpoint, slots=2), Client(endpoint) as client:
        wait_for_workers(client, 1)
        with pytest.raises(errors.InvalidRequestError, match="70,000,000 characters"):
            client.submit(prompt, max_tokens=2)
        context = zmq.Context()
        sock = dealer(context, endpoint, Settings.coerce(None))
        try:
            send_frames(sock, encode(Submit("big", "", {"max_tokens": 2}, prompt=prompt)))
            assert sock.poll(60_000), "the broker did not answer an oversized SUBMIT"
            answer = decode(recv_frames(sock))
        finally:
            sock.close(linger=0)
            context.term()
        after = client.complete("small", max_tokens=2)
    assert isinstance(answer, Error) and answer.request_id == "big"
    assert answer.code == errors.InvalidRequestError.code and "67,108,864 bytes" in answer.message
    assert after.usage.completion_tokens == 2


def test_d5_a_stopped_lock_holder_delays_a_start_only_up_to_the_bound(tiny_model, tmp_path):
    """D5: a start whose family lock is held by a stopped process used to wait for ever, silently.
    It now logs the holder (pid, for how long, stopped) and, past cache_lock_timeout_s, goes on
    without exporting."""
    command = [sys.executable, "-m", "ovpool", "generate", "--model", str(tiny_model()), "--cache-dir",
               str(tmp_path / "cache"), "--max-tokens", "4", "Once upon a time"]
    holder = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                              env={**os.environ, PAUSE_ENV: "blob-write"})
    try:
        for line in holder.stderr:  # it holds the family lock, mid-export
            if line.strip() == "OVPOOL_CACHE_TEST_PAUSED blob-write":
                break
        holder.send_signal(signal.SIGSTOP)
        waiter = subprocess.run([*command, "--set", "cache_lock_timeout_s=1"], capture_output=True,
                                text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert waiter.returncode == 0, waiter.stderr
    assert waiter.stdout.strip()
    assert f"is held by pid {holder.pid} on " in waiter.stderr
    assert "(it is stopped: SIGSTOP or a debugger)" in waiter.stderr
    assert "setting cache_lock_timeout_s); compiling without exporting" in waiter.stderr
    assert "model cache WROTE" not in waiter.stderr


class SilentWorker:
    """A peer that registers as a worker with 100 slots and heartbeats, but never answers."""

    def __init__(self, endpoint: str):
        self._context = zmq.Context()
        self._socket = dealer(self._context, endpoint, Settings.coerce(None))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self.requests: list[str] = []

    def __enter__(self) -> SilentWorker:
        send_frames(self._socket, encode(Ready("silent", ["null"], "CPU", 100, "host", 1)))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close(linger=0)
        self._context.term()

    def _run(self) -> None:
        while not self._stop.is_set():
            send_frames(self._socket, encode(Heartbeat()))
            while self._socket.poll(50):
                msg = decode(recv_frames(self._socket))
                if isinstance(msg, Request):
                    self.requests.append(msg.request_id)


def test_d6_a_worker_that_never_answers_loses_its_requests(endpoint):
    """D6: a peer that heartbeats but never answers kept its requests for ever (it advertised 100
    slots, so it drew 9 of 10). With progress_timeout_s=1 they move to the real worker, and the
    silent one draws no more."""
    with fast_heartbeats(0.2), broker(endpoint, "--set", "progress_timeout_s=1"), \
            null_worker(endpoint, slots=4), Client(endpoint) as client, SilentWorker(endpoint) as silent:
        wait_for_workers(client, 2)
        futures = [client.submit(f"p{i}", max_tokens=5, seed=i) for i in range(10)]
        results = [f.result(timeout=60) for f in futures]
        status = client.status()
    assert [r.token_ids for r in results] == [expected(f"p{i}", i, 5) for i in range(10)]
    assert silent.requests, "the silent worker drew no request: the scenario did not happen"
    [stuck] = [w for w in status["workers"] if w["id"] == "silent"]
    assert stuck["active"] == 0 and stuck["cap"] == 0
    assert status["counters"]["stalled"] == len(silent.requests) and status["counters"]["completed"] == 10


def test_d7_a_reused_request_id_is_refused_not_rerouted(endpoint):
    """D7: a SUBMIT reusing a running request's id used to re-route that stream to the new sender
    (which got the first client's 300 tokens)."""
    with broker(endpoint), null_worker(endpoint, slots=2, token_delay=0.002), Client(endpoint) as client:
        wait_for_workers(client, 1)
        mine = client.submit("mine", max_tokens=300, seed=1)
        client.status()  # one round trip on mine's connection: the broker has taken mine's SUBMIT
        context = zmq.Context()
        thief = dealer(context, endpoint, Settings.coerce(None))
        try:
            send_frames(thief, encode(Submit(mine.request_id, "", {"max_tokens": 300}, prompt="theirs")))
            assert thief.poll(30_000)
            refusal = decode(recv_frames(thief))
            result = mine.result(timeout=60)
            assert not thief.poll(0), "the other client got more than its refusal"
        finally:
            thief.close(linger=0)
            context.term()
    assert isinstance(refusal, Error) and refusal.code == errors.InvalidRequestError.code
    assert "in use by another client" in refusal.message
    assert result.token_ids == expected("mine", 1, 300)


async def _abandon_async(endpoint: str, count: int) -> None:
    for _ in range(count):
        async with AsyncClient(endpoint) as client:
            client.submit("long", max_tokens=2000).add_done_callback(lambda f: f.exception())


def test_d8_clients_closing_early_free_their_slots_and_queue_places(endpoint):
    """D8: Client.close() sent no CANCEL: 300 clients leaving early held the 4 slots and 256 queue
    places until their timeout, and the next client got QueueFull. 250 Clients and 50
    AsyncClients each submit a 2,000-token request (20 s at this worker's pace) and close."""
    with broker(endpoint), null_worker(endpoint, slots=4, token_delay=0.01):
        for _ in range(250):
            with Client(endpoint) as leaving:
                leaving.submit("long", max_tokens=2000)
        asyncio.run(_abandon_async(endpoint, 50))
        with Client(endpoint) as client:
            after = client.complete("after", max_tokens=2, timeout=10)
            status = client.status()
    assert after.usage.completion_tokens == 2
    assert status["in_flight"] == 0 and not any(status["queues"].values())
    counters = status["counters"]
    assert counters["completed"] == 1 and counters["cancelled"] == counters["submitted"] - 1
