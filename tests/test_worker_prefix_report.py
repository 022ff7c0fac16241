"""The prefix-cache summary a worker heartbeats: the backend's held keys plus each finished chat's
keys with its answer, bounded, and the prompt token counters."""

from __future__ import annotations

from ovpool.prefix_key import after_answer, route_keys
from ovpool.protocol import HELD_KEYS_MAX, Request
from ovpool.sampling_params import SamplingParams
from ovpool.worker.null_backend import NullBackend
from ovpool.worker.prefix_report import PrefixReport

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


def started(backend: NullBackend, report: PrefixReport, rid: str, messages: list[dict]) -> tuple[bytes, ...]:
    keys = route_keys("m", messages=messages).keys
    backend.add(rid, messages, SamplingParams(max_tokens=1), keys)
    report.started(Request(rid, "m", {}, None, messages, list(keys)), keys)
    return keys


def test_a_finished_chat_is_reported_with_its_answer_deepest_first():
    backend = NullBackend(["m"])
    report = PrefixReport(backend)
    keys = started(backend, report, "r", CHAT)
    assert report.heartbeat().held == list(reversed(keys))  # the backend's: most recent first
    report.ended("r", "Hello!")
    hb = report.heartbeat()
    answer_key = after_answer("m", None, CHAT, "Hello!").keys[-1]
    assert hb.held == [answer_key, keys[1], keys[0]]
    assert hb.prompt_tokens == backend.prompt_tokens == 4
    assert hb.cached_prompt_tokens == backend.cached_prompt_tokens


def test_a_failed_or_cancelled_request_adds_no_answer_and_the_report_is_bounded():
    backend = NullBackend(["m"], slots=1000)
    report = PrefixReport(backend)
    keys = started(backend, report, "r", CHAT)
    report.ended("r")
    assert report.heartbeat().held == list(reversed(keys))
    for i in range(HELD_KEYS_MAX):
        started(backend, report, f"x{i}", [{"role": "user", "content": str(i)}])
    assert len(report.heartbeat().held) == HELD_KEYS_MAX
