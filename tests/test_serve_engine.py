"""`ovpool serve` with the real engine and a shared cache dir, on a tiny generated model."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
from serve_helpers import free_port, scrape, serve, wait_for

from ovpool.cache.ir import FORM
from ovpool.client import Client

pytestmark = pytest.mark.slow


def cache_lines(text: str, kind: str) -> list[str]:
    """Pids of the workers that logged ``model cache KIND``."""
    return re.findall(rf"\[(\d+)\]: model cache {kind} ", text)


def test_cold_cache_three_workers_compile_once_and_a_killed_worker_imports(tmp_path, tiny_model):
    model, cache, port = tiny_model(), tmp_path / "cache", free_port()
    # Heartbeats of 1 s, not the helpers' 0.2 s: the table below is one snapshot of the registered
    # workers, and at a 0.6 s expiry a worker building its paged graph on a loaded 2-core host (two
    # busy loops beside the suite) missed it and was away re-registering (2 of 3 runs failed so).
    with serve(tmp_path, "--model", str(model), "--workers", "3", "--cache-dir", str(cache),
               "--metrics-port", str(port), env={"OVPOOL_HEARTBEAT_INTERVAL_S": "1.0"}) as served:
        workers = served.wait_states("ready", timeout=120)
        log = served.output()
        assert len(cache_lines(log, "WROTE")) == 1, log
        assert len(cache_lines(log, "HIT")) == 2, log
        with Client(served.endpoint) as client:
            assert client.complete("hello", model=str(model), max_tokens=3).usage.completion_tokens >= 1
            loads = [w["load"] for w in client.status()["workers"]]
        assert sorted(load["outcome"] for load in loads) == ["hit", "hit", "wrote"]
        assert all(load["seconds"] > 0 and load["entry"] == loads[0]["entry"] for load in loads)
        table = subprocess.run([sys.executable, "-m", "ovpool", "status", "--broker", served.endpoint],
                               capture_output=True, text=True, check=True).stdout
        counts = [len(re.findall(rf" {outcome} \d+\.\ds\b", table)) for outcome in ("hit", "wrote")]
        assert counts == [2, 1], table
        assert table.count(": continuous batching on") == 3, table
        events = [labels for (name, labels), value in scrape(port).items()
                  if name == "ovpool_worker_cache_total" and value == 1]
        assert sorted(dict(labels)["event"] for labels in events) == ["hits", "hits", "misses", "writes"]

        victim = workers["CPU#1"]["pid"]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: served.workers()["CPU#1"]["restarts"] == 1
                 and served.workers()["CPU#1"]["state"] == "ready", 60, "the killed worker to return")
        new_pid = served.workers()["CPU#1"]["pid"]
        assert new_pid != victim
        log = served.output()
        assert str(new_pid) in cache_lines(log, "HIT"), "the restarted worker did not import the blob"
        assert len(cache_lines(log, "WROTE")) == 1
        if cache_lines(log, "IR HIT"):  # its batching graph's IR loads after READY, once it is idle
            wait_for(lambda: str(new_pid) in cache_lines(served.output(), "IR HIT"), 60,
                     "the restarted worker's batching graph")
    ls = [sys.executable, "-m", "ovpool", "cache", "ls", "--cache-dir", str(cache), "--json"]
    listed = subprocess.run(ls, capture_output=True, text=True, check=True)
    # The engine's graph, and the batching graph's IR where OpenVINO cannot import it compiled.
    entries = {e["form"]: e for e in json.loads(listed.stdout)}
    assert len(entries) == len(json.loads(listed.stdout)) and set(entries) <= {"compiled model", FORM}
    for entry in entries.values():
        assert entry["models"] == [str(model)]
        assert entry["hits"] == 3  # two workers at the cold start, then the restarted one


def test_cache_only_miss_is_reported_failing_not_retried(tmp_path, tiny_model):
    args = ("--model", str(tiny_model()), "--workers", "1", "--cache-dir", str(tmp_path / "empty"),
            "--cache-only")
    with serve(tmp_path, *args) as served:
        worker = served.wait_states("failing", timeout=120)["CPU"]
    assert worker["restarts"] == 0 and "not retried" in worker["reason"]  # the next start would miss too
    assert "MISS" in worker["reason"] or "miss" in worker["reason"], worker["reason"]
    assert "model cache WROTE" not in served.output()
