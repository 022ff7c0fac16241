"""Deploying without dropping requests, as a user runs it: SIGTERM drains `ovpool serve`, `ovpool
restart --rolling` replaces its workers under load, `ovpool drain WORKER` and the HTTP API's admin
route take one worker out. The null backend stands in for the model (its tokens are the indices,
so a stream is whole when it reads 0..n-1 once); one test drains SmolLM2 for real."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest
from serve_helpers import alive, descendants, serve, wait_for

from ovpool import errors

pytestmark = pytest.mark.slow

NULL = ("--backend", "null")


def _http(port: int, path: str, body: dict | None = None, key: str = "") -> tuple[int, Any, dict]:
    """(status, headers, JSON body) of a GET (or a POST of ``body``) to the HTTP API."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read())


def _whole(stream, n: int, read: int = 0) -> bool:
    """Whether ``stream`` (of which ``read`` tokens were read already) brings the rest of its ``n``
    tokens, each once and in order, and its FINAL."""
    indices = [d.index for d in stream]
    return indices == list(range(read, n)) and stream.completion.usage.completion_tokens == n


def test_sigterm_finishes_the_streams_refuses_new_requests_then_exits_leaving_no_process(tmp_path):
    # 80 tokens at 0.1 s a step: the streams outlast the checks made while serve drains, on a busy
    # host too (once they end, serve exits and the late requests find no server).
    with serve(tmp_path, "--workers", "2", *NULL, "--token-delay", "0.1", http=True) as served:
        served.wait_states("ready")
        served.wait_service("http")
        with served.client() as client:
            streams = [client.stream(f"s{i}", max_tokens=80) for i in range(6)]
            assert [next(s).index for s in streams] == [0] * 6
            children = descendants(served.proc.pid)
            served.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: served.state().get("draining"), 60, "serve to say it drains")
            with pytest.raises(errors.DrainingError, match="draining"):
                client.complete("too late", max_tokens=2)
            status, headers, body = _http(served.http_port, "/v1/completions",
                                          {"model": "smollm2", "prompt": "too late", "max_tokens": 2})
            assert (status, headers.get("Retry-After")) == (503, "1")
            assert body["error"]["code"] == "request.draining"
            status, headers, body = _http(served.http_port, "/health/ready")
            assert (status, body["status"], headers.get("Retry-After")) == (503, "draining", "1")
            assert all(_whole(s, 80, read=1) for s in streams)
        assert served.proc.wait(30) == 0
    wait_for(lambda: not any(alive(p) for p in children), 60, "every child to exit")
    assert {w["state"] for w in served.workers().values()} == {"stopped"}


def test_what_outlives_shutdown_timeout_fails_with_a_clear_error(tmp_path):
    with serve(tmp_path, "--workers", "1", *NULL, "--token-delay", "0.05",
               "--set", "shutdown_timeout_s=0.5") as served:
        served.wait_states("ready")
        with served.client() as client:
            stream = client.stream("long", max_tokens=1000)
            next(stream)
            served.proc.send_signal(signal.SIGTERM)
            with pytest.raises(errors.DrainingError, match=r"timeout of 0.5 s ended \(setting shutdown_t"):
                list(stream)
        assert served.proc.wait(30) == 0


def test_a_rolling_restart_under_streaming_load_fails_no_request_and_breaks_no_stream(tmp_path):
    with serve(tmp_path, "--workers", "2", *NULL, "--token-delay", "0.01", closed=True) as served:
        before = {n: w["pid"] for n, w in served.wait_states("ready").items()}
        stop, results = threading.Event(), []

        def load(i: int) -> None:
            with served.client() as client:
                n = 0
                while not stop.is_set():
                    try:
                        results.append(_whole(client.stream(f"load {i} {n}", max_tokens=30), 30))
                    except errors.OvpoolError as exc:
                        results.append(exc)
                    n += 1

        loaders = [threading.Thread(target=load, args=(i,)) for i in range(4)]
        for t in loaders:
            t.start()
        wait_for(lambda: len(results) >= 4, 30, "the load to run")
        done = subprocess.run([sys.executable, "-m", "ovpool", "restart", "--rolling", "--state-file",
                               str(served.state_file), "--set", "slots=4", "--timeout", "120"],
                              capture_output=True, text=True)
        during = len(results)
        wait_for(lambda: len(results) >= during + 4, 30, "more requests after the restart")
        stop.set()
        for t in loaders:
            t.join()
        assert done.returncode == 0, done.stdout + done.stderr
        assert "every worker runs a new process" in done.stdout
        assert results and all(r is True for r in results), [r for r in results if r is not True][:3]
        after = served.workers()
        assert all(after[n]["pid"] != pid and after[n]["state"] == "ready" for n, pid in before.items())
        with served.client() as client:
            assert {w["slots"] for w in client.status()["workers"]} == {4}  # the new setting


def test_ovpool_drain_and_the_admin_route_retire_one_worker_while_the_other_serves(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("sesame\n")
    with serve(tmp_path, "--workers", "2", *NULL, "--token-delay", "0.05", "--api-key-file", str(key_file),
               http=True) as served:
        served.wait_states("ready")
        served.wait_service("http")
        assert _http(served.http_port, "/admin/drain", {"worker": "CPU#0"})[0] == 401
        status, _, body = _http(served.http_port, "/admin/drain", {"worker": "GPU.9"}, key="sesame")
        assert status == 400 and "no worker named 'GPU.9'" in body["error"]["message"]
        with served.client() as client:
            running = client.stream("on both", max_tokens=20)
            other = client.stream("on both", max_tokens=20)
            next(running), next(other)
            status, _, body = _http(served.http_port, "/admin/drain", {"worker": "CPU#0"}, key="sesame")
            assert status == 200 and [w.split("@")[0] for w in body["draining"]["workers"]] == ["CPU#0"]
            assert _whole(running, 20, read=1) and _whole(other, 20, read=1)
            wait_for(lambda: served.workers()["CPU#0"]["state"] == "stopped", 60, "CPU#0 to stop")
            assert served.workers()["CPU#0"]["reason"] == "drained"
            assert client.complete("still served", max_tokens=3).usage.completion_tokens == 3
            cli = subprocess.run([sys.executable, "-m", "ovpool", "drain", "CPU#1", "--state-file",
                                  str(served.state_file)], capture_output=True, text=True)
            assert cli.returncode == 0 and "draining CPU#1@" in cli.stdout, cli.stdout + cli.stderr
            wait_for(lambda: served.workers()["CPU#1"]["state"] == "stopped", 60, "CPU#1 to stop")
            missing = subprocess.run([sys.executable, "-m", "ovpool", "drain", "CPU#7", "--state-file",
                                      str(served.state_file)], capture_output=True, text=True)
            assert missing.returncode == 2 and "no worker named 'CPU#7'" in missing.stderr


def test_sigterm_to_a_worker_host_finishes_its_streams_while_the_rest_of_the_pool_serves(tmp_path):
    (tmp_path / "host2").mkdir()
    with serve(tmp_path, "--workers", "1", *NULL, "--token-delay", "0.05", "--slots", "2") as served, \
            serve(tmp_path / "host2", "--broker", served.endpoint, "--workers", "1", *NULL,
                  "--token-delay", "0.05", "--slots", "2") as host2:
        with served.client() as client:
            wait_for(lambda: len(client.status()["workers"]) == 2, 30, "both hosts' workers")
            streams = [client.stream(f"s{i}", max_tokens=40) for i in range(4)]  # 2 on each host
            assert [next(s).index for s in streams] == [0] * 4
            host2.proc.send_signal(signal.SIGTERM)
            assert all(_whole(s, 40, read=1) for s in streams)
            assert host2.proc.wait(30) == 0
            assert client.complete("after", max_tokens=3).usage.completion_tokens == 3


def test_sigterm_lets_smollm2_streams_finish(tmp_path, smollm2_path):
    with serve(tmp_path, "--model", str(smollm2_path), "--workers", "1", "--no-cache",
               env={"OVPOOL_HEARTBEAT_INTERVAL_S": "1.0"}) as served:
        served.wait_states("ready", timeout=180)
        with served.client() as client:
            streams = [client.stream(f"Story {i}: once upon a time", max_tokens=24, ignore_eos=True)
                       for i in range(4)]
            next(streams[0])
            served.proc.send_signal(signal.SIGTERM)
            for s in streams:
                list(s)
            assert [s.completion.usage.completion_tokens for s in streams] == [24] * 4
        assert served.proc.wait(60) == 0
