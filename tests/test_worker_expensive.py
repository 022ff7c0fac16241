"""Expensive work does not take a worker out, with a real broker process: a step or a request
start longer than the heartbeat expiry (the link thread heartbeats meanwhile), and on SmolLM2 a
pathological regex and a grammar with no base case (issue 24: 90 s and 48.6 s of a worker's
loop), each answered alone with an error naming response_format while other streams on the
worker run to their end. Asserted on the broker's counters and worker list, never on wall-clock
gaps."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from ovpool import Engine, errors, timing
from ovpool.client import Client
from ovpool.completion import Completion
from ovpool.sampling_params import SamplingParams
from ovpool.testing.pool import PoolProcess, broker, fast_heartbeats, free_endpoint, wait_for_workers
from ovpool.worker.backend import Backend
from ovpool.worker.null_backend import NullBackend
from ovpool.worker.process import Worker


class BlockingBackend(NullBackend):
    """Its first request holds the loop for twice the heartbeat expiry, in the step (a forward pass
    or a llguidance call on a loaded host: one C call the loop cannot answer from) or in its start
    (between the loop's read of the broker's messages and its silence check)."""

    def __init__(self, where: str, **kwargs):
        super().__init__(**kwargs)
        self.where, self.blocked = where, 0

    def _block(self, where: str) -> None:
        if where == self.where and not self.blocked:
            self.blocked += 1
            time.sleep(2 * timing.HEARTBEAT_EXPIRY_S)

    def add(self, *args, **kwargs):
        self._block("add")
        return super().add(*args, **kwargs)

    def step(self):
        if self.active:
            self._block("step")
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


@pytest.mark.parametrize("where", ["step", "add"])
def test_a_loop_held_longer_than_the_heartbeat_expiry_keeps_worker_and_broker_linked(where):
    # Neither side may take the other for gone: the broker would requeue the request, the worker
    # (reconnecting) drop it.
    endpoint = free_endpoint()
    backend = BlockingBackend(where, models=["m"], slots=2)
    with fast_heartbeats(0.2), broker(endpoint), worker_thread(endpoint, backend), Client(endpoint) as client:
        before = wait_for_workers(client, 1)["workers"]
        done = client.complete("hello there", model="m", max_tokens=3, seed=1)
        status = client.status()
    assert backend.blocked == 1 and done.usage.completion_tokens == 3
    assert status["counters"]["requeued"] == 0 and status["counters"]["completed"] == 1
    assert [w["id"] for w in status["workers"]] == [w["id"] for w in before]



def test_a_first_step_longer_than_the_heartbeat_expiry_right_after_ready_keeps_the_worker():
    # A model loaded on demand: its request waits at the broker, is dispatched as READY arrives
    # and its first step (the first pass's kernel layout, seconds on a loaded host) starts before
    # the loop's first heartbeat; the keeper must repeat one meanwhile, or the broker drops the
    # worker 3 s after READY and requeues the request.
    endpoint = free_endpoint()
    backend = BlockingBackend("step", models=["m"], slots=2)
    with fast_heartbeats(0.2), broker(endpoint), Client(endpoint) as client:
        wait_for_workers(client, 0)
        with ThreadPoolExecutor(1) as pool:
            queued = pool.submit(client.complete, "hello there", model="m", max_tokens=3, seed=1)
            while not client.status()["queues"].get("m"):
                time.sleep(0.01)
            with worker_thread(endpoint, backend):
                done = queued.result(timeout=60)
                status = client.status()
    assert backend.blocked == 1 and done.usage.completion_tokens == 3
    assert status["counters"]["requeued"] == 0 and status["counters"]["completed"] == 1

PATHOLOGICAL = {"repetition": {"type": "regex", "pattern": "a{1000000}"},
                "no base case": {"type": "grammar", "lark": 'start: "a" start'}}


def outcome(future) -> Completion | errors.OvpoolError:
    try:
        return future.result(timeout=600)
    except errors.OvpoolError as exc:
        return exc


def test_pathological_constraints_are_answered_alone_and_the_worker_stays(smollm2_path):
    endpoint = free_endpoint()
    with broker(endpoint), PoolProcess("worker", "--broker", endpoint, "--model", str(smollm2_path),
                                       "--served-name", "smollm2", "--slots", "4"), \
            Client(endpoint, model="smollm2") as client:
        before = wait_for_workers(client, 1, timeout=300)["workers"]
        free = [client.submit(f"Count to {i}.", max_tokens=40, ignore_eos=True) for i in (5, 9)]
        hard = {name: client.submit("Write the letter a.", max_tokens=16, response_format=fmt)
                for name, fmt in PATHOLOGICAL.items()}
        answers = {name: outcome(f) for name, f in hard.items()}
        # Within the client's 1 MiB, over what 8,192 tokens of SmolLM2 (81 characters at most) hold.
        huge = outcome(client.submit("word " * 200_000, max_tokens=1))
        done = [outcome(f) for f in free]
        status = client.status()
    for name, got in answers.items():
        if isinstance(got, errors.OvpoolError):
            assert isinstance(got, errors.InvalidRequestError) and "response_format" in str(got), (name, got)
        else:  # served: the text keeps to the constraint
            assert set(got.text) <= {"a"} and got.finish_reason == "length", (name, got.text)
    assert isinstance(huge, errors.InvalidRequestError) and "1000000 characters" in str(huge), huge
    assert all(isinstance(c, Completion) and c.usage.completion_tokens == 40 for c in done), done
    assert status["counters"]["requeued"] == 0
    assert [w["id"] for w in status["workers"]] == [w["id"] for w in before]


def test_a_prompt_too_long_for_any_tokenization_is_refused_before_tokenizing(tiny_model, monkeypatch):
    with Engine(tiny_model(), settings={"max_prompt_tokens": 8}) as engine:
        longest = max(map(len, engine.tokenizer.tokens))
        fits = "x" * (8 * longest + 1)  # not refused by its length: by its tokens, as before
        with pytest.raises(errors.InvalidRequestError, match=r"the prompt has \d+ tokens"):
            engine.admit(fits, SamplingParams(max_tokens=1))
        monkeypatch.setattr(engine.tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized"))
        for prompt in ("x" * (8 * longest + 2), [{"role": "user", "content": "x" * (8 * longest + 2)}]):
            with pytest.raises(errors.InvalidRequestError, match="characters.*max_prompt_tokens = 8"):
                engine.admit(prompt, SamplingParams(max_tokens=1))
