"""`ovpool serve` as a user runs it: workers start, crash and restart, fail and stop cleanly.

These use the null backend (fake tokens), so they test supervision, not the engine;
test_serve_engine.py runs the real engine and cache.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from serve_helpers import alive, descendants, free_port, scrape, serve, unsupported_model, wait_for

from ovpool import errors, timing
from ovpool.client import Client

pytestmark = pytest.mark.slow


def test_three_workers_answer_and_sigterm_leaves_no_process(tmp_path):
    with serve(tmp_path, "--workers", "3", "--backend", "null", closed=True) as served:
        workers = served.wait_states("ready")
        assert sorted(workers) == ["CPU#0", "CPU#1", "CPU#2"]
        with served.client() as client:
            assert client.complete("hello", max_tokens=4).usage.completion_tokens == 4
            status = client.status()
            assert {w["pid"] for w in status["workers"]} == {w["pid"] for w in workers.values()}
            # serve's report (SUPERVISED) comes on its own connection: wait for the one that says ready.
            wait_for(lambda: {s["name"]: s["state"] for s in client.status()["supervised"]}
                     == dict.fromkeys(workers, "ready"), 60, "serve's report in status")
        children = descendants(served.proc.pid)
        assert len(children) >= 4  # broker + 3 workers
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(60) == 0
        wait_for(lambda: not any(alive(p) for p in children), 60, "every child to exit")
        assert {w["state"] for w in served.workers().values()} == {"stopped"}


def test_killed_worker_is_restarted(tmp_path):
    with serve(tmp_path, "--workers", "2", "--backend", "null") as served:
        before = served.wait_states("ready")
        victim = before["CPU#1"]["pid"]
        os.kill(victim, signal.SIGKILL)
        after = wait_for(lambda: (w := served.workers())["CPU#1"]["restarts"] == 1
                         and w["CPU#1"]["state"] == "ready" and w, 30, "CPU#1 to come back")
        assert after["CPU#1"]["pid"] != victim and after["CPU#1"]["last_exit"] == -signal.SIGKILL
        assert after["CPU#0"]["pid"] == before["CPU#0"]["pid"] and after["CPU#0"]["restarts"] == 0
        with Client(served.endpoint) as client:
            # The restarted worker may register before the broker's heartbeat expiry drops the
            # killed one; after that expiry exactly the two live workers remain.
            workers = wait_for(lambda: len(w := client.status()["workers"]) == 2 and w,
                               timing.HEARTBEAT_EXPIRY_S + 10, "the killed worker to expire")
            assert {w["pid"] for w in workers} == {after["CPU#0"]["pid"], after["CPU#1"]["pid"]}


def test_a_model_that_cannot_load_is_not_retried_and_its_error_reaches_status_and_clients(tmp_path):
    model = unsupported_model(tmp_path / "mamba.gguf")
    why = "architecture 'mamba' (general.architecture) is not supported"
    with serve(tmp_path, "--model", str(model), "--workers", "1", "--keep-up-on-worker-failure") as served:
        failing = served.wait_states("failing", timeout=90)["CPU"]
        assert failing["restarts"] == 0 and failing["last_exit"] == errors.EXIT_PERMANENT
        assert why in failing["reason"] and "not retried" in failing["reason"]
        time.sleep(1.0)  # a permanent error is left alone: no new start while serve keeps running
        assert served.workers()["CPU"]["restarts"] == 0 and served.proc.poll() is None
        with Client(served.endpoint) as client:
            status = client.status()
            # At once, not after the broker's start-up grace, and saying why.
            with pytest.raises(errors.ModelNotFoundError) as refused:
                client.complete("hi")
        assert status["workers"] == [] and [s["state"] for s in status["supervised"]] == ["failing"]
        (failed,) = status["failed"]
        assert failed["id"].startswith("CPU@") and failed["models"] == [str(model)]
        assert str(refused.value) == f"no worker serves any model yet: worker {failed['id']} failed: {why}" \
            + "; supported: llama, qwen2, qwen3, gemma3, phi3"
        table = subprocess.run([sys.executable, "-m", "ovpool", "status", "--broker", served.endpoint],
                               capture_output=True, text=True, timeout=60)
        text = " ".join(table.stdout.split())  # wrapped at the terminal's width
        assert f"{failed['id']}: cannot load {model}: {why}" in text, table.stdout
        assert "CPU: failing: error: " in text


def test_a_killed_broker_is_restarted_and_the_next_request_succeeds(tmp_path):
    """Workers, the HTTP API and a client connected before the kill all reconnect to the new broker."""
    with serve(tmp_path, "--workers", "1", "--backend", "null", http=True, closed=True) as served, \
            served.client() as client:
        served.wait_states("ready")
        broker = served.wait_service("broker")
        assert client.complete("before", max_tokens=2).usage.completion_tokens == 2
        os.kill(broker["pid"], signal.SIGKILL)
        after = wait_for(lambda: (b := served.state()["broker"])["restarts"] == 1 and b["state"] == "ready"
                         and b, 30, f"the broker to come back (log:\n{served.output()[-3000:]})")
        assert after["pid"] != broker["pid"] and after["last_exit"] == -signal.SIGKILL
        assert served.proc.poll() is None
        # The worker re-registers once it finds the broker silent (HEARTBEAT_EXPIRY_S): the request
        # waits for it (broker grace), it does not fail.
        assert client.complete("after", max_tokens=3).usage.completion_tokens == 3
        body = json.dumps({"model": "smollm2", "prompt": "x", "max_tokens": 2}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{served.http_port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert json.load(resp)["usage"]["completion_tokens"] == 2
        assert served.workers()["CPU"]["restarts"] == 0  # the worker rode it out, not restarted
    assert "the broker on" in served.output() and "restarted (pid" in served.output()


def test_probe_reads_serve_state(tmp_path):
    state_file = tmp_path / "serve.json"
    probe = [sys.executable, "-m", "ovpool", "probe", "--state-file", str(state_file)]
    assert subprocess.run(probe, capture_output=True).returncode == 1
    with serve(tmp_path, "--workers", "1", "--backend", "null") as served:
        served.wait_states("ready")
        assert subprocess.run(probe + ["--ready"], capture_output=True).returncode == 0


@pytest.mark.parametrize("content, problem", [
    (b"\xff\xfe{", "cannot be read: 'utf-8' codec can't decode byte 0xff in position 0"),
    (b"{not json", "cannot be read: Expecting property name enclosed in double quotes"),
    (b"[1]", "is not a view `ovpool serve --state-file` writes"),
    (b'{"updated": "x", "workers": 5}', "is not a view"),
    (b'{"updated": 1e999, "workers": []}', "is not a view"),  # fresh for ever
    (b'{"updated": 1, "workers": [{"x": 1}]}', "is not a view"),
    (b"[" * 200_000 + b"]" * 200_000, "cannot be read: JSON nested deeper than the decoder follows"),
])
def test_the_probe_on_a_state_file_that_is_not_serves_fails_in_one_line(tmp_path, content, problem):
    """Each was a traceback (UnicodeDecodeError, TypeError, AttributeError, KeyError)."""
    state_file = tmp_path / "serve.json"
    state_file.write_bytes(content)
    probe = [sys.executable, "-m", "ovpool", "probe", "--ready", "--state-file", str(state_file)]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert f": state file {state_file} {problem}" in done.stdout and len(done.stdout.splitlines()) == 1


def test_broker_metrics_endpoint_is_scraped_and_parsed(tmp_path):
    port = free_port()
    with serve(tmp_path, "--workers", "1", "--backend", "null", "--metrics-port", str(port)) as served:
        served.wait_states("ready")
        with Client(served.endpoint) as client:
            for _ in range(2):
                client.complete("hello", max_tokens=5)
            assert len(list(client.stream("hi", max_tokens=3))) >= 1
        families = wait_for(lambda: (f := scrape(port)) and f.get(
            ("ovpool_requests_total", (("model", "smollm2"), ("outcome", "ok")))) == 3 and f,
            10, "three finished requests in the metrics")
    assert families[("ovpool_tokens_generated_total", (("model", "smollm2"),))] == 13
    assert families[("ovpool_time_to_first_token_seconds_count", (("model", "smollm2"),))] == 3
    assert families[("ovpool_workers", (("state", "ready"),))] == 1
    assert families[("ovpool_queue_depth", (("model", "smollm2"),))] == 0
    # Raw prompts of a few words have no route key (no full piece of text): none was routed by prefix.
    assert families[("ovpool_prefix_routed", (("outcome", "hit"),))] == 0
    assert [k for k in families if k[0] == "ovpool_worker_prompt_tokens"]

