"""One `ovpool serve`, several models loaded on demand: real processes (the broker, serve, one
worker process per loaded model). The null backend where the model does not matter; SmolLM2 once,
beside two bad files."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from serve_helpers import alive, serve, unsupported_model, wait_for

from ovpool import errors
from ovpool.client import Client

pytestmark = pytest.mark.slow


def _models(port: int) -> dict[str, dict]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as resp:
        return {m["id"]: m for m in json.loads(resp.read())["data"]}


def _post(port: int, path: str) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())["id"]
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["error"]["message"]


def _entries(client: Client) -> dict[str, dict]:
    """serve's report per model, as the broker holds it."""
    return {e["model"]: e for e in client.status()["supervised"] if "model" in e}


def _complete_all(client: Client, model: str, n: int) -> list[str]:
    texts: list[str] = []
    threads = [threading.Thread(target=lambda i=i: texts.append(
        client.complete(f"hello {i}", model=model, max_tokens=3, timeout=60).text)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return texts


def test_three_models_on_a_budget_of_two_swap_lru_first_and_keep_the_pinned_one(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text('[models.c]\npath = "c"\npinned = true\n')
    with serve(tmp_path, "--backend", "null", "--model", "a", "--model", "b", "--models", str(path),
               "--max-loaded", "2", http=True) as served, Client(served.endpoint) as client:
        served.wait_service("http")
        wait_for(lambda: _entries(client).get("c", {}).get("residency") == "loaded", 30, "c pinned")
        assert {m: e["state"] for m, e in _models(served.http_port).items()} == {
            "a": "unloaded", "b": "unloaded", "c": "loaded"}
        assert len(_complete_all(client, "a", 8)) == 8  # 8 concurrent first requests: one load
        assert _entries(client)["a"]["loads"] == 1
        for model in ("b", "a", "b", "c", "a"):  # each swap unloads the other of a and b
            assert client.complete("hi", model=model, max_tokens=3, timeout=60).usage.completion_tokens == 3
        status = client.status()
        assert status["counters"]["completed"] == status["counters"]["submitted"] == 13
        entries = _entries(client)
        assert (entries["a"]["loads"], entries["b"]["loads"]) == (3, 2)
        assert entries["b"]["residency"] in ("unloading", "unloaded")
        assert "least recently used" in entries["b"]["residency_reason"]
        assert (entries["c"]["loads"], entries["c"]["unloads"]) == (1, 0)
        # The admin routes: b loads with no request (a, least recently used, makes room), then unloads.
        assert _post(served.http_port, "/v1/models/b/load") == (202, "b")
        wait_for(lambda: _models(served.http_port)["b"]["state"] == "loaded", 30, "b loaded on request")
        assert _post(served.http_port, "/v1/models/b/unload") == (202, "b")
        wait_for(lambda: _models(served.http_port)["b"]["state"] == "unloaded", 30, "b unloaded on request")
        assert _post(served.http_port, "/v1/models/c/unload")[0] == 400  # pinned
        assert _post(served.http_port, "/v1/models/nope/load")[0] == 404


def test_a_streaming_model_unloads_only_after_its_stream_and_keep_alive_expiry_unloads(tmp_path):
    with serve(tmp_path, "--backend", "null", "--token-delay", "0.05", "--model", "a", "--model", "b",
               "--max-loaded", "1", "--keep-alive", "1") as served, Client(served.endpoint) as client:
        served.wait_service("broker")  # a loaded host may start it past the client's connect timeout
        stream = iter(client.stream("long", model="a", max_tokens=100, timeout=60))  # 5 s: past the checks
        texts = [next(stream).text]  # a is loaded and streaming
        done_b: list[str] = []
        thread = threading.Thread(target=lambda: done_b.append(
            client.complete("short", model="b", max_tokens=2, timeout=60).text))
        thread.start()
        wait_for(lambda: client.status()["queues"].get("b") == 1, 60, "b's request to queue")
        wait_for(lambda: _entries(client)["a"]["residency"] == "loaded", 60, "serve's report of a")
        assert client.status()["queues"].get("b") == 1  # a streams: b waits, a stays
        texts += [d.text for d in stream]
        thread.join(60)
        assert len(texts) == 100 and len(done_b) == 1  # the whole stream, then b
        b_pid = wait_for(lambda: served.workers()["b:CPU"]["pid"], 60, "b's worker")
        entries = wait_for(lambda: (e := _entries(client))["b"]["residency"] == "unloaded" and e, 30,
                           "b's keep-alive to expire")
        assert entries["b"]["residency_reason"] == "idle for its keep-alive of 1 s"
        wait_for(lambda: not alive(b_pid), 60, "b's worker process to exit")


def test_a_bad_model_is_failed_and_its_requests_fail_at_once_while_the_others_serve(tmp_path, smollm2_path):
    (tmp_path / "text.gguf").write_text("not a model")
    mamba = unsupported_model(tmp_path / "mamba.gguf")
    with serve(tmp_path, "--model", f"smollm2={smollm2_path}", "--model", f"notgguf={tmp_path / 'text.gguf'}",
               "--model", f"mamba={mamba}", "--model", "gemma3-270m", http=True) as served, \
            Client(served.endpoint) as client:
        served.wait_service("http")
        listed = wait_for(lambda: (m := _models(served.http_port))["notgguf"]["state"] == "failed" and m,
                          30, "the file that is no GGUF to be failed")
        assert "is not a GGUF file" in listed["notgguf"]["reason"]
        # Before either loads: the base model says it takes prompts only, read from its header.
        gemma = listed["gemma3-270m"]
        assert (gemma["state"], gemma["capabilities"]) == ("unloaded", ["completion"])
        assert listed["smollm2"]["capabilities"] == ["chat", "completion"]
        started = time.monotonic()
        with pytest.raises(errors.ModelNotFoundError, match="not a GGUF file"):
            client.complete("hi", model="notgguf", max_tokens=2, timeout=30)
        with pytest.raises(errors.ModelNotFoundError, match="architecture 'mamba'"):
            client.complete("hi", model="mamba", max_tokens=2, timeout=30)  # fails in its worker
        assert time.monotonic() - started < 20  # at once: a load, not a timeout
        wait_for(lambda: _models(served.http_port)["mamba"]["state"] == "failed", 30, "mamba failed")
        reply = client.complete("The capital of France is", model="smollm2", max_tokens=4, timeout=120)
        assert reply.usage.completion_tokens == 4
        assert _models(served.http_port)["smollm2"]["state"] == "loaded"


def test_a_byte_budget_measured_from_pss_unloads_the_idle_model_and_says_when_one_alone_is_over(tmp_path):
    with serve(tmp_path, "--backend", "null", "--model", "a", "--model", "b", "--max-loaded-mb", "1",
               "--keep-alive", "-1") as served:
        served.wait_service("broker")
        with Client(served.endpoint) as client:
            assert client.complete("hi", model="a", max_tokens=2, timeout=60).usage.completion_tokens == 2
            a = wait_for(lambda: "alone" in (e := _entries(client)["a"])["residency_reason"] and e, 30,
                         "a's PSS to be measured over the budget")
            assert a["memory_mib"] > 1
            assert "over max_loaded_mb=1: it stays loaded and serves" in a["residency_reason"]
            assert a["residency"] == "loaded"
            assert client.complete("hi", model="b", max_tokens=2, timeout=60).usage.completion_tokens == 2
            entries = _entries(client)
            assert entries["a"]["residency"] in ("unloading", "unloaded")
            assert entries["a"]["residency_reason"] == \
                "least recently used, making room for 'b' (max_loaded_mb=1 on CPU)"
        assert "alone holds" in served.output()  # serve's log says it once
