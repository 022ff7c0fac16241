"""A worker holds its next pass, after one that ended a chat's answer, for the chat's next turn
(ovpool.worker.follow_ups): the turn joins the next pass instead of waiting for all of it."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from ovpool.completion import Usage
from ovpool.config import WorkerConfig
from ovpool.protocol import Final, Request
from ovpool.worker import process
from ovpool.worker.events import Finished
from ovpool.worker.follow_ups import CONTINUED_TOKENS, FollowUps
from ovpool.worker.null_backend import NullBackend
from ovpool.worker.process import Worker
from tests.test_worker_process import HandBroker

CHAT = Usage(prompt_tokens=1100, completion_tokens=32, cached_prompt_tokens=1056)
FRESH = Usage(prompt_tokens=1100, completion_tokens=32, cached_prompt_tokens=CONTINUED_TOKENS - 1)


def test_a_hold_lasts_until_as_many_requests_arrived_as_chat_answers_ended():
    f = FollowUps(0.02)
    f.step(1.0)
    f.ended(CHAT, now=10.0)
    f.ended(CHAT, now=10.0)
    assert f.hold(10.005) == pytest.approx(0.015)
    f.arrived(10.006)
    assert f.hold(10.007) == pytest.approx(0.013)  # one of the two next turns is still due
    f.arrived(10.008)
    assert f.hold(10.008) == 0.0
    assert f.held == pytest.approx(0.008)


def test_no_hold_after_a_fresh_prompt_nor_when_off_and_none_past_the_wait():
    on, off = FollowUps(0.02), FollowUps(0.0)
    on.step(1.0)
    off.step(1.0)
    on.ended(FRESH, now=0.0)
    off.ended(CHAT, now=0.0)
    assert on.hold(0.0) == off.hold(0.0) == 0.0
    on.ended(CHAT, now=1.0)
    assert on.hold(1.02) == 0.0 and on.held == pytest.approx(0.02)  # nobody came: the whole wait is spent
    assert on.hold(1.0) == 0.0  # and over


def test_a_hold_that_ran_out_while_the_worker_was_idle_counts_its_wait_only():
    f = FollowUps(0.02)
    f.step(1.0)
    f.ended(CHAT, now=0.0)  # the last answer: nothing runs, the loop does not ask for the hold
    f.arrived(60.0)  # the next request, a minute later
    assert f.held == pytest.approx(0.02) and f.hold(60.0) == 0.0
    f.ended(CHAT, now=61.0)
    assert f.hold(61.0) == pytest.approx(0.02)  # within the share: 20 ms of 1 s


def test_holds_stay_within_their_share_of_the_time_in_passes():
    f = FollowUps(0.02, share=0.05)
    f.step(0.4)  # 20 ms of holds allowed
    f.ended(CHAT, now=0.0)
    assert f.hold(0.03) == 0.0  # waited it out: 20 ms held
    f.ended(CHAT, now=1.0)
    assert f.hold(1.0) > 0  # 20 ms is within 5% of 0.4 s
    f.hold(1.03)
    f.ended(CHAT, now=2.0)
    assert f.hold(2.0) == 0.0  # 40 ms is not
    f.step(0.6)  # now 50 ms
    f.ended(CHAT, now=3.0)
    assert f.hold(3.0) > 0


class _ChatBackend(NullBackend):
    """Every prompt came from the cache (a chat's history); ``passes``: the requests each step ran."""

    def __init__(self):
        super().__init__(["m"], slots=4, token_delay_s=0.002)
        self.passes: list[set[str]] = []

    def step(self):
        self.passes.append(set(self._sessions))
        return [dataclasses.replace(e, completion=dataclasses.replace(
            e.completion, usage=dataclasses.replace(e.completion.usage, cached_prompt_tokens=1024)))
            if isinstance(e, Finished) else e for e in super().step()]


def _turn(rid: str, max_tokens: int) -> Request:
    return Request(rid, "m", {"max_tokens": max_tokens, "seed": 1}, prompt="hello there")


def _next_turn_pass(tmp_path, monkeypatch, wait_s: float) -> tuple[int, int]:
    """A long answer running, a chat's turn ends, its next turn is sent when its FINAL is read:
    the passes (turn's last, next turn's first). The worker's holds last up to ``wait_s``: longer
    than the setting allows, so that no stall of a loaded host outlasts one (a hold ends as soon
    as the turn arrives)."""
    monkeypatch.setattr(process, "FollowUps", lambda _wait_s: FollowUps(wait_s))
    backend, stop, broker = _ChatBackend(), threading.Event(), HandBroker(f"ipc://{tmp_path}/broker")
    config = WorkerConfig(follow_up_ms=1)
    try:
        with Worker(f"ipc://{tmp_path}/broker", backend, name="w", config=config) as worker:
            thread = threading.Thread(target=worker.run, args=(stop,))
            thread.start()
            try:
                broker.next()  # READY
                broker.send(_turn("long", 100_000))
                broker.send(_turn("turn1", 3))
                broker.until(Final, "turn1")
                broker.send(_turn("turn2", 1))
                broker.until(Final, "turn2")
            finally:
                stop.set()
                thread.join()
    finally:
        broker.close()
    last = max(i for i, p in enumerate(backend.passes) if "turn1" in p)
    return last, min(i for i, p in enumerate(backend.passes) if "turn2" in p)


def test_a_chats_next_turn_joins_the_pass_after_its_answer(tmp_path, monkeypatch):
    last, first = _next_turn_pass(tmp_path, monkeypatch, wait_s=60.0)
    assert first == last + 1  # the worker held the other answer's passes for it
