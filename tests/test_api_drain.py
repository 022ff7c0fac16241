"""`ovpool api` stopping (SIGTERM sets its stop event): it drains. Readiness and new requests get
503 with Retry-After at once, a stream in flight goes on, and one still open when
shutdown_timeout_s ends gets an error event naming it, never a cut connection."""

from __future__ import annotations

import http.client
import json
import threading

from serve_helpers import free_port, wait_for

from ovpool.api import server
from ovpool.api.app import Config
from ovpool.api.keys import ApiKeys
from ovpool.client import Client
from ovpool.settings import Settings
from ovpool.testing.pool import broker, free_endpoint, null_worker, wait_for_workers

BEAT = {"OVPOOL_HEARTBEAT_INTERVAL_S": "0.2"}


def _request(port: int, method: str, path: str, body: dict | None = None) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, json.dumps(body) if body else None, {"Content-Type": "application/json"})
    return conn.getresponse()


def test_a_stopping_api_refuses_new_requests_and_fails_what_outlives_its_timeout():
    endpoint, port = free_endpoint(), free_port()
    with broker(endpoint, env=BEAT), null_worker(endpoint, model="m", token_delay=0.05, env=BEAT):
        with Client(endpoint) as client:
            wait_for_workers(client, 1, timeout=60)
        config = Config(endpoint, Settings.resolve({"broker": endpoint}), ApiKeys(), 64,
                        shutdown_timeout_s=3.0)  # the late request must come before it ends
        stop = threading.Event()
        api = threading.Thread(target=server.run, args=(config, f"127.0.0.1:{port}", stop))
        api.start()
        try:
            wait_for(lambda: _ready(port), 30, "the API to be ready")
            stream = _request(port, "POST", "/v1/completions",
                              {"model": "m", "prompt": "long", "max_tokens": 1000, "stream": True})
            assert stream.status == 200 and stream.readline().startswith(b"data: ")
            stop.set()
            wait_for(lambda: _request(port, "GET", "/health/ready").status == 503, 60, "readiness to fail")
            late = _request(port, "POST", "/v1/completions",
                            {"model": "m", "prompt": "late", "max_tokens": 2})
            assert (late.status, late.getheader("Retry-After")) == (503, "1")
            assert json.loads(late.read())["error"]["code"] == "request.draining"
            events = [line for line in stream.read().split(b"\n\n") if b'"error"' in line]
            assert len(events) == 1 and b"request.draining" in events[0]
            assert b"shutdown_timeout_s" in events[0]
        finally:
            stop.set()
            api.join(30)
        assert not api.is_alive()


def _ready(port: int) -> bool:
    try:
        return _request(port, "GET", "/health/ready").status == 200
    except OSError:
        return False
