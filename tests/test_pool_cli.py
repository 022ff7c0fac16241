"""`ovpool complete` and `ovpool status` as a user runs them against a broker."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from ovpool.client import Client
from ovpool.testing.pool import broker, fast_heartbeats, free_endpoint, null_worker, wait_for_workers

pytestmark = pytest.mark.slow


def ovpool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ovpool", *args], capture_output=True, text=True, timeout=60)


def test_complete_and_status_commands():
    endpoint = free_endpoint()
    with fast_heartbeats(0.2), broker(endpoint), null_worker(endpoint, model="tiny", slots=2), \
            Client(endpoint) as client:
        wait_for_workers(client, 1)
        expected = client.complete("hello", max_tokens=4, seed=9)
        request = ("complete", "hello", "--broker", endpoint, "--max-tokens", "4", "--seed", "9")
        as_json, streamed = ovpool(*request, "--json"), ovpool(*request, "--stream")
        missing = ovpool("complete", "hello", "--broker", endpoint, "--model", "nope")
        status = ovpool("status", "--broker", endpoint, "--json")
        table = ovpool("status", "--broker", endpoint)
    assert json.loads(as_json.stdout)["token_ids"] == expected.token_ids
    assert streamed.stdout.strip() == expected.text.strip()
    assert missing.returncode == 2 and "no worker serves model 'nope'" in missing.stderr
    workers = json.loads(status.stdout)["workers"]
    assert [w["models"] for w in workers] == [["tiny"]]
    assert "tiny" in table.stdout and "0/2 busy" in table.stdout


def test_a_chats_turns_follow_its_history_and_status_shows_the_prefix_cache():
    endpoint = free_endpoint()
    with fast_heartbeats(0.2), broker(endpoint), null_worker(endpoint, slots=2), \
            null_worker(endpoint, slots=2), Client(endpoint) as client:
        wait_for_workers(client, 2)
        messages = [{"role": "system", "content": "Answer in one word."}]
        for turn in range(3):
            messages.append({"role": "user", "content": f"question {turn}"})
            answer = client.chat(messages, max_tokens=3, seed=turn)
            messages.append({"role": "assistant", "content": answer.text})
        # Every turn ran on the one worker: the NullBackend counts a prompt's words as its tokens,
        # and reports them in its next heartbeat.
        words = sum(len("\n".join(m["content"] for m in messages[:i]).split()) for i in (2, 4, 6))
        status, deadline = client.status(), time.monotonic() + 20
        while sum(w["prefix_cache"]["prompt_tokens"] for w in status["workers"]) < words:
            assert time.monotonic() < deadline, f"no heartbeat reported the prompts: {status['workers']}"
            time.sleep(0.05)
            status = client.status()
        table = ovpool("status", "--broker", endpoint)
    assert status["counters"]["prefix_hits"] == 2 and status["counters"]["prefix_misses"] == 1
    assert sorted(w["prefix_cache"]["prompt_tokens"] for w in status["workers"]) == [0, words]
    assert "prefix_hits=2" in table.stdout and f"/{words} (" in table.stdout
