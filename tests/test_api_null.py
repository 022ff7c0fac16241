"""The HTTP API as a user reaches it: `ovpool serve --http` driven by the official openai SDK
(sync and async, streamed and not) and by httpx for the raw bytes, on the null backend.

One server for the module: two null workers of 2 slots each named foo and bar, two API keys,
queue_limit 0 (a request that finds no free slot is refused at once: the 429 case).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys

import httpx
import openai
import pytest
from serve_helpers import serve, wait_for

from ovpool import timing
from ovpool.client import Client
from ovpool.testing.pool import PoolProcess, broker, fast_heartbeats, free_endpoint, null_worker

pytestmark = pytest.mark.slow
KEYS = ("key-one", "key-two")
TOKEN_DELAY = 0.01  # seconds per token of the null workers: a 300-token stream takes ~3 s


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("api"), "--workers", "2", "--backend", "null", "--slots", "2",
               "--token-delay", str(TOKEN_DELAY), "--served-name", "foo", "--served-name", "bar",
               env={"OVPOOL_API_KEY": ",".join(KEYS), "OVPOOL_QUEUE_LIMIT": "0"}, http=True) as s:
        s.wait_states("ready")
        s.base = f"http://127.0.0.1:{s.http_port}"
        wait_for(lambda: _health(s.base) == 200, 30, "the HTTP API to see the workers")
        # A new broker queues unknown models for BROKER_GRACE_S (workers may be re-registering).
        wait_for(lambda: _status_of(s.base, {"model": "absent", "prompt": "x"}) == 404, 30,
                 "the broker's grace to end")
        yield s


def _health(base: str) -> int:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code
    except httpx.HTTPError:
        return 0


def _status_of(base: str, body: dict) -> int:
    return httpx.post(f"{base}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEYS[0]}"},
                      timeout=30).status_code


def sdk(served, key: str = KEYS[0]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.base}/v1", api_key=key, max_retries=0)


def reference(served, prompt: str, seed: int, max_tokens: int) -> str:
    """The text the pool gives through its own ZeroMQ client (the null backend's tokens depend
    only on seed and prompt)."""
    with Client(served.endpoint) as client:
        return client.complete(prompt, model="foo", seed=seed, max_tokens=max_tokens).text


def test_models_lists_every_served_name_with_its_worker_count(served):
    models = sdk(served).models.list()
    assert [(m.id, m.workers, m.object, m.owned_by) for m in models.data] == [
        ("bar", 2, "model", "ovpool"), ("foo", 2, "model", "ovpool")]


def test_completions_n_seed_and_usage_match_the_zmq_client(served):
    out = sdk(served, KEYS[1]).completions.create(model="bar", prompt="one two three", max_tokens=5, n=2,
                                                  seed=11)
    assert [c.index for c in out.choices] == [0, 1]
    assert [c.text for c in out.choices] == [reference(served, "one two three", 11, 5),
                                             reference(served, "one two three", 12, 5)]
    assert {c.finish_reason for c in out.choices} == {"length"}
    # The prompt counts once for both choices (3 words are 3 null-backend tokens).
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (3, 10, 13)
    assert out.object == "text_completion" and out.id.startswith("cmpl-") and out.model == "bar"
    again = sdk(served).completions.create(model="foo", prompt="one two three", max_tokens=5, n=2, seed=11)
    assert [c.text for c in again.choices] == [c.text for c in out.choices]  # seeds reproduce


def test_completions_prompt_list_and_echo(served):
    out = sdk(served).completions.create(model="foo", prompt=["a b", "c"], max_tokens=2, seed=3, echo=True)
    assert [c.text for c in out.choices] == ["a b" + reference(served, "a b", 3, 2),
                                             "c" + reference(served, "c", 3, 2)]
    assert out.usage.prompt_tokens == 3


def test_chat_streamed_async_equals_not_streamed(served):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]

    async def main():
        client = openai.AsyncOpenAI(base_url=f"{served.base}/v1", api_key=KEYS[0], max_retries=0)
        whole = await client.chat.completions.create(model="foo", messages=messages, max_tokens=6, seed=5)
        stream = await client.chat.completions.create(model="foo", messages=messages, max_tokens=6, seed=5,
                                                      stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        await client.close()
        return whole, chunks

    whole, chunks = asyncio.run(main())
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].finish_reason == "length"
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * 6 + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens == 4  # the null backend's words
    assert all(c.usage is None for c in chunks[:-1])


def test_sync_stream_with_n_2_interleaves_both_choices(served):
    stream = sdk(served).completions.create(model="foo", prompt="x y", max_tokens=4, n=2, seed=1, stream=True)
    texts = {0: "", 1: ""}
    finished = {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                finished[c.index] = c.finish_reason
    assert texts == {0: reference(served, "x y", 1, 4), 1: reference(served, "x y", 2, 4)}
    assert finished == {0: "length", 1: "length"}


def raw_events(served, body: dict, key: str = KEYS[0]) -> tuple[httpx.Response, bytes]:
    with httpx.stream("POST", f"{served.base}/v1/chat/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {key}"}) as response:
        return response, response.read()


def test_raw_sse_framing(served):
    response, raw = raw_events(served, {"model": "foo", "messages": [{"role": "user", "content": "hi"}],
                                        "max_tokens": 3, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert raw.endswith(b"\n\ndata: [DONE]\n\n")
    events = raw.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    bodies = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert all(e.startswith(b"data: {") and b"\n" not in e for e in events[:-2])
    assert [b["object"] for b in bodies] == ["chat.completion.chunk"] * 4
    assert len({b["id"] for b in bodies}) == 1


def test_stream_failing_after_its_first_token_ends_with_an_error_event_then_done(served):
    body = {"model": "foo", "messages": [{"role": "user", "content": "long"}], "max_tokens": 1000,
            "stream": True, "timeout": 0.3}
    response, raw = raw_events(served, body)
    assert response.status_code == 200  # the first token came: the status was sent with it
    events = raw.split(b"\n\n")
    assert events[-2] == b"data: [DONE]"
    error = json.loads(events[-3].removeprefix(b"data: "))["error"]
    assert error["type"] == "timeout" and "timeout" in error["message"]
    assert all(b'"error"' not in e for e in events[:-3]) and len(events) > 5
    with pytest.raises(openai.APIError, match="timeout"):
        for _ in sdk(served).chat.completions.create(model="foo", messages=body["messages"], max_tokens=1000,
                                                     stream=True, extra_body={"timeout": 0.3}):
            pass


def test_each_error_status_is_the_sdks_own_exception(served):
    client, messages = sdk(served), [{"role": "user", "content": "x"}]
    with pytest.raises(openai.NotFoundError) as e404:
        client.chat.completions.create(model="absent", messages=messages)
    assert e404.value.body["code"] == "model_not_found" and "absent" in e404.value.message
    with pytest.raises(openai.NotFoundError):  # streamed: refused before the first token
        client.chat.completions.create(model="absent", messages=messages, stream=True)
    with pytest.raises(openai.BadRequestError) as e400:
        client.completions.create(model="foo", prompt="x", top_p=3)
    assert e400.value.body["param"] == "top_p"
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model="foo", messages=messages, response_format={"type": "xml"})
    with pytest.raises(openai.AuthenticationError, match="invalid API key"):
        sdk(served, "wrong").models.list()
    missing = httpx.get(f"{served.base}/v1/models")  # no Authorization header at all
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.InternalServerError) as e504:
        client.completions.create(model="foo", prompt="x", max_tokens=1000, extra_body={"timeout": 0.2})
    assert e504.value.status_code == 504


def test_queue_full_is_429_with_retry_after(served):
    """Four slots busy and queue_limit 0: the fifth request is refused."""
    body = {"model": "foo", "prompt": "long", "max_tokens": 300, "stream": True}
    headers = {"Authorization": f"Bearer {KEYS[0]}"}
    with httpx.Client(base_url=served.base, headers=headers, timeout=30) as http:
        busy = [http.stream("POST", "/v1/completions", json=body) for _ in range(4)]
        responses = [b.__enter__() for b in busy]
        try:
            assert [r.status_code for r in responses] == [200] * 4
            refused = http.post("/v1/completions", json={**body, "stream": False})
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            with pytest.raises(openai.RateLimitError):
                sdk(served).completions.create(model="foo", prompt="x", max_tokens=1)
        finally:
            for b in busy:
                b.__exit__(None, None, None)
    wait_for(lambda: _in_flight(served) == 0, 60, "the abandoned streams to be cancelled")


def _in_flight(served) -> int:
    """Busy slots, as `ovpool status` reports them."""
    out = subprocess.run([sys.executable, "-m", "ovpool", "status", "--json", "--broker", served.endpoint],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return sum(w["active"] for w in json.loads(out)["workers"])


def test_disconnect_mid_stream_frees_the_slot(served):
    body = {"model": "foo", "prompt": "long", "max_tokens": 3000, "stream": True}
    with httpx.stream("POST", f"{served.base}/v1/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {KEYS[0]}"}) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: {")
        assert _in_flight(served) == 1
    # The connection is closed: the API cancels the request and the broker frees the slot.
    wait_for(lambda: _in_flight(served) == 0, 2 * timing.HEARTBEAT_INTERVAL_S + 5, "the slot to be freed")


def test_a_client_gone_while_its_completion_waits_frees_the_slot(served):
    """A non-streamed request is answered only at its end; the API's sweep sees the client leave
    before that and cancels the request (30 s of tokens here)."""
    body = json.dumps({"model": "foo", "prompt": "long", "max_tokens": 3000}).encode()
    with socket.create_connection(("127.0.0.1", served.http_port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s"
                     % (KEYS[0].encode(), len(body), body))
        wait_for(lambda: _in_flight(served) == 1, 60, "the request to start")
    wait_for(lambda: _in_flight(served) == 0, 2 * timing.HEARTBEAT_INTERVAL_S + 5, "the slot to be freed")


def test_health_and_metrics(served):
    assert httpx.get(f"{served.base}/health").json()["status"] == "ok"
    # Its own requests: under pytest-xdist the module's other tests may run in another process.
    list(sdk(served).completions.create(model="foo", prompt="counted", max_tokens=2, stream=True))
    with pytest.raises(openai.NotFoundError):
        sdk(served).chat.completions.create(model="absent", messages=[{"role": "user", "content": "x"}])
    text = httpx.get(f"{served.base}/metrics").text
    assert 'ovpool_http_requests_total{endpoint="completions",status="200"}' in text
    assert 'ovpool_http_requests_total{endpoint="chat",status="404"}' in text
    assert "ovpool_http_time_to_first_token_seconds_bucket" in text
    assert 'ovpool_http_tokens_total{direction="out",endpoint="completions"}' in text


def test_killed_worker_mid_stream_still_completes_every_token_once(served):
    """Last in the module: a worker dies (serve restarts it)."""
    prompt, seed, n = "replayed prompt", 42, 120
    stream = sdk(served).completions.create(model="foo", prompt=prompt, max_tokens=n, seed=seed, stream=True)
    texts = []
    for chunk in stream:
        texts.append(chunk.choices[0].text)
        if len(texts) == 10:
            with Client(served.endpoint) as client:
                busy = [w for w in client.status()["workers"] if w["active"]]
            assert len(busy) == 1
            os.kill(busy[0]["pid"], signal.SIGKILL)
    tokens = [t for t in texts if t]
    assert "".join(tokens) == reference(served, prompt, seed, n)
    assert len(tokens) == n  # each token once: the replay's repeats were dropped
    served.wait_states("ready")


def test_no_worker_left_for_the_model_is_503(tmp_path):
    """A model whose only worker died: its requests wait BROKER_GRACE_S for one, then fail."""
    endpoint, port = free_endpoint(), int(free_endpoint().rsplit(":", 1)[1])
    with fast_heartbeats(0.2), broker(endpoint), null_worker(endpoint, model="solo") as worker, \
            PoolProcess("api", "--broker", endpoint, "--bind", f"127.0.0.1:{port}"):
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _health(base) == 200, 30, "the worker to register")
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        assert client.completions.create(model="solo", prompt="x", max_tokens=2).usage.completion_tokens == 2
        worker.kill()
        with pytest.raises(openai.InternalServerError) as e503:
            client.completions.create(model="solo", prompt="x", max_tokens=2)
        assert e503.value.status_code == 503 and "gone" in e503.value.message
        assert _health(base) == 503


def test_api_command_errors_are_one_clear_line(served):
    taken = subprocess.run([sys.executable, "-m", "ovpool", "api", "--bind", f"127.0.0.1:{served.http_port}"],
                           capture_output=True, text=True, timeout=60)
    assert taken.returncode == 2 and "cannot listen on" in taken.stderr and "Traceback" not in taken.stderr
    bad = subprocess.run([sys.executable, "-m", "ovpool", "api", "--bind", "8000"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "expected HOST:PORT" in bad.stderr
