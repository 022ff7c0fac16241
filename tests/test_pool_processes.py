"""The pool as users run it: a broker process, null-backend worker processes and the Client."""

from __future__ import annotations

import concurrent.futures
import signal
import threading
import time

import pytest
from test_pool_flow import expected

from ovpool import errors, timing
from ovpool.client import Client
from ovpool.testing.pool import broker, fast_heartbeats, free_endpoint, null_worker, wait_for_workers

pytestmark = pytest.mark.slow  # several processes per test


@pytest.fixture(autouse=True)
def _fast():
    with fast_heartbeats(0.2):
        yield


@pytest.fixture
def endpoint():
    return free_endpoint()


def _stream_into(client: Client, sink: list, prompt: str, **kw) -> threading.Thread:
    def run():
        try:
            sink.extend(client.stream(prompt, **kw))
        except errors.OvpoolError as exc:
            sink.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_fifty_concurrent_requests_equal_each_run_alone(endpoint):
    with broker(endpoint), null_worker(endpoint, slots=4, token_delay=0.002), \
            null_worker(endpoint, slots=4, token_delay=0.002), Client(endpoint) as client:
        wait_for_workers(client, 2)
        futures = [client.submit(f"prompt {i}", max_tokens=8, seed=i, temperature=0.7) for i in range(50)]
        together = [f.result(timeout=60) for f in futures]
        alone = [client.complete(f"prompt {i}", max_tokens=8, seed=i, temperature=0.7) for i in range(50)]
        status = client.status()
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    assert [c.text for c in together] == [c.text for c in alone]
    assert len({tuple(c.token_ids) for c in together}) == 50  # distinct requests, not one reply reused
    assert status["counters"]["completed"] == 100 and status["in_flight"] == 0


def test_killed_worker_loses_no_accepted_request_and_no_token_index(endpoint):
    n_tokens = 40
    with broker(endpoint), null_worker(endpoint, slots=4, token_delay=0.02) as victim, \
            null_worker(endpoint, slots=4, token_delay=0.02), Client(endpoint) as client:
        wait_for_workers(client, 2)
        streams, threads = _streams_under_way(client, n_tokens)
        victim.kill()
        for t in threads:
            t.join(timeout=60)
        status = client.status()
    _assert_whole(streams, n_tokens)
    assert status["counters"]["requeued"] >= 1 and len(status["workers"]) == 1


def test_a_stopped_worker_loses_no_request_and_serves_again_once_resumed(endpoint):
    """SIGSTOP, not kill: the worker's connection stays up and it wakes later still holding its
    requests. They are re-dispatched once its heartbeats stop; what it sends after SIGCONT for
    them reaches no client (no index twice), and it registers and serves again."""
    n_tokens = 60
    with broker(endpoint), null_worker(endpoint, slots=4, token_delay=0.02) as victim, \
            null_worker(endpoint, slots=4, token_delay=0.02), Client(endpoint) as client:
        wait_for_workers(client, 2)
        streams, threads = _streams_under_way(client, n_tokens)
        victim.proc.send_signal(signal.SIGSTOP)
        try:
            for t in threads:
                t.join(timeout=60)
            stopped = client.status()
        finally:
            victim.proc.send_signal(signal.SIGCONT)
        wait_for_workers(client, 2)
        again = [client.submit(f"q{i}", max_tokens=n_tokens, seed=i) for i in range(16)]
        after = [f.result(timeout=60) for f in again]
        status = client.status()
    _assert_whole(streams, n_tokens)
    assert stopped["counters"]["requeued"] >= 1 and len(stopped["workers"]) == 1
    assert [c.token_ids for c in after] == [expected(f"q{i}", i, n_tokens) for i in range(16)]
    assert {w["active"] for w in status["workers"]} == {0} and status["counters"]["failed"] == 0


def test_broker_restart_mid_run_completes_or_fails_clearly(endpoint, tmp_path):
    # The client waits connect_timeout_s for the dropped connection to come back: long enough here
    # for a new broker process to start on a loaded host (the 2 s default fails the requests).
    with null_worker(endpoint, slots=4, token_delay=0.02), \
            Client(endpoint, settings={"connect_timeout_s": 60}) as client:
        with broker(endpoint) as first:
            wait_for_workers(client, 1)
            futures = [client.submit(f"r{i}", max_tokens=30, seed=i) for i in range(6)]  # no model named
            time.sleep(0.2)
            first.kill()
        with broker(endpoint):
            done, not_done = concurrent.futures.wait(futures, timeout=30)
            assert not not_done, "a request hung across the broker restart"
            for f in futures:
                exc = f.exception()
                assert exc is None or isinstance(exc, errors.OvpoolError)
            ok = [f.result() for f in futures if f.exception() is None]
            assert all(len(c.token_ids) == 30 for c in ok)
            assert len(ok) == 6, [f.exception() for f in futures]  # resent to the new broker
            assert wait_for_workers(client, 1)["workers"][0]["slots"] == 4
            assert client.complete("after", max_tokens=3).usage.completion_tokens == 3


def test_cancel_mid_stream_frees_the_slot(endpoint):
    with broker(endpoint), null_worker(endpoint, slots=1, token_delay=0.5), Client(endpoint) as client:
        wait_for_workers(client, 1)
        stream = client.stream("long", max_tokens=2000)
        assert next(stream).index == 0
        stream.close()  # leaving a stream early cancels the request
        # The one slot is free again: else the short request waits out the long one's 1,000 s of
        # tokens and times out (test_broker_router checks "at once", without processes).
        short = client.complete("short", max_tokens=2, timeout=60)
        status = client.status()
    assert short.usage.completion_tokens == 2
    assert status["counters"]["cancelled"] == 1 and status["workers"][0]["active"] == 0


def test_queue_overflow_deadline_unknown_model_and_limits(endpoint):
    with broker(endpoint, "--queue-limit", "2", "--set", "max_new_tokens=500"), \
            null_worker(endpoint, slots=1, token_delay=0.05), Client(endpoint) as client:
        wait_for_workers(client, 1)
        time.sleep(timing.BROKER_GRACE_S)  # past the grace a restarted broker gives workers
        running = client.submit("busy", max_tokens=400)
        queued = [client.submit("wait", max_tokens=1) for _ in range(2)]
        with pytest.raises(errors.QueueFullError, match="queue_limit"):
            client.submit("one too many", max_tokens=1).result(timeout=60)
        with pytest.raises(errors.ModelNotFoundError, match="'nope'"):
            client.complete("x", model="nope")
        with pytest.raises(errors.InvalidRequestError, match="max_new_tokens"):
            client.complete("x", max_tokens=501)
        client.cancel(queued[1])
        with pytest.raises(errors.RequestTimeoutError):
            client.complete("late", max_tokens=1, timeout=0.3)
        client.cancel(running)
        with pytest.raises(errors.CancelledError):
            running.result(timeout=60)  # not cancelled: done in 20 s, no error
        assert queued[0].result(timeout=60).usage.completion_tokens == 1


def test_sigterm_worker_hands_back_its_requests(endpoint):
    with broker(endpoint), null_worker(endpoint, slots=2, token_delay=0.02) as leaving, \
            Client(endpoint) as client:
        wait_for_workers(client, 1)
        futures = [client.submit(f"h{i}", max_tokens=500, seed=i) for i in range(2)]
        time.sleep(0.2)
        with null_worker(endpoint, slots=2, token_delay=0.001):
            wait_for_workers(client, 2)
            assert leaving.stop() == 0
            results = [f.result(timeout=30) for f in futures]
            status = client.status()
    assert [len(r.token_ids) for r in results] == [500, 500]
    assert status["counters"]["requeued"] >= 2 and status["counters"]["failed"] == 0


def _streams_under_way(client: Client, n_tokens: int) -> tuple[list[list], list[threading.Thread]]:
    """Eight streams ("p0".."p7", seeds 0-7), each three tokens in: their deltas and threads."""
    streams: list[list] = [[] for _ in range(8)]
    threads = [_stream_into(client, s, f"p{i}", max_tokens=n_tokens, seed=i) for i, s in enumerate(streams)]
    _wait_until(lambda: all(len(s) >= 3 for s in streams))
    return streams, threads


def _assert_whole(streams: list[list], n_tokens: int) -> None:
    """Each stream holds every index once, with the tokens NullBackend makes for its request (not
    those of a second run)."""
    for i, stream in enumerate(streams):
        assert [d.index for d in stream] == list(range(n_tokens))
        assert [d.token_id for d in stream] == expected(f"p{i}", i, n_tokens)


def _wait_until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)
