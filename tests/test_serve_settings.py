"""`ovpool serve --set` hands each child the settings of its scope (broker, workers, HTTP API)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from serve_helpers import serve

from ovpool import errors
from ovpool.serve.spec import CHILD_SCOPES, PoolSpec
from ovpool.settings import REGISTRY, SERVE


def _sets(argv: list[str]) -> list[str]:
    return [argv[i + 1].partition("=")[0] for i, arg in enumerate(argv) if arg == "--set"]


def test_each_child_gets_exactly_the_settings_of_its_scope():
    spec = PoolSpec(http="127.0.0.1:8000", assignments=(
        "queue_limit=2", "routing=least_loaded", "max_new_tokens=5", "max_prompt_tokens=3",
        "attention=sdpa", "connect_timeout_s=4", "prefill_chunk=16"))
    assert _sets(spec.broker_argv()) == ["queue_limit", "routing", "max_new_tokens"]
    assert _sets(spec.worker_argv("CPU", "CPU")) == ["max_new_tokens", "max_prompt_tokens", "attention",
                                                     "prefill_chunk"]
    assert _sets(spec.api_argv()) == ["max_new_tokens", "connect_timeout_s"]


def test_every_setting_reaches_some_child_of_serve():
    read = {scope for scopes in CHILD_SCOPES.values() for scope in scopes} | {SERVE}  # serve's own
    assert [s.name for s in REGISTRY.values() if not set(s.scopes) & read] == []


def _chat(port: int, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_serve_set_reaches_the_broker_the_workers_and_the_api(tmp_path):
    # One worker of one slot, a second per token: a request of 3 tokens holds the slot 3 s.
    with serve(tmp_path, "--backend", "null", "--workers", "1", "--slots", "1", "--token-delay", "1",
               "--set", "queue_limit=2", "--set", "max_new_tokens=3", "--set", "max_prompt_tokens=3",
               http=True) as served:
        served.wait_states("ready")
        served.wait_service("http")
        # The API's default max_tokens is its max_new_tokens.
        reply = _chat(served.http_port, {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]})
        assert reply["usage"]["completion_tokens"] == 3
        with served.client() as client:
            with pytest.raises(errors.InvalidRequestError, match="max_prompt_tokens = 3"):
                client.complete("one two three four", max_tokens=1)  # the worker's limit
            with pytest.raises(errors.InvalidRequestError, match="limit of 3"):
                client.complete("x", max_tokens=4)  # the broker's
            running = client.stream("busy", max_tokens=3)
            assert next(running).index == 0  # it holds the only slot
            queued = [client.submit("wait", max_tokens=1) for _ in range(2)]
            with pytest.raises(errors.QueueFullError, match="has 2 requests queued"):
                client.submit("one too many", max_tokens=1).result(timeout=10)
            running.close()
            assert [q.result(timeout=30).usage.completion_tokens for q in queued] == [1, 1]
