"""Expensive work does not take a worker out: a step longer than the heartbeat expiry, with a real
broker process, leaves the worker registered and nothing requeued (the link thread heartbeats
meanwhile). Asserted on the broker's counters and worker list, never on wall-clock gaps."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from ovpool import timing
from ovpool.client import Client
from ovpool.testing.pool import broker, fast_heartbeats, free_endpoint, wait_for_workers
from ovpool.worker.backend import Backend, NullBackend
from ovpool.worker.process import Worker


class BlockingBackend(NullBackend):
    """The first step with a session in it holds the loop for twice the heartbeat expiry (a forward
    pass or a llguidance call on a loaded host: one C call the loop cannot answer from)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.blocked = 0

    def step(self):
        if self.active and not self.blocked:
            self.blocked += 1
            time.sleep(2 * timing.HEARTBEAT_EXPIRY_S)
        return super().step()


@contextlib.contextmanager
def worker_thread(endpoint: str, backend: Backend) -> Iterator[None]:
    stop = threading.Event()

    def run() -> None:
        with Worker(endpoint, backend, name="w") as worker:
            worker.run(stop)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_a_step_longer_than_the_heartbeat_expiry_does_not_get_the_worker_declared_dead():
    endpoint = free_endpoint()
    backend = BlockingBackend(models=["m"], slots=2)
    with fast_heartbeats(0.2), broker(endpoint), worker_thread(endpoint, backend), Client(endpoint) as client:
        before = wait_for_workers(client, 1)["workers"]
        done = client.complete("hello there", model="m", max_tokens=3, seed=1)
        status = client.status()
    assert backend.blocked == 1 and done.usage.completion_tokens == 3
    assert status["counters"]["requeued"] == 0 and status["counters"]["completed"] == 1
    assert [w["id"] for w in status["workers"]] == [w["id"] for w in before]
