"""A real broker process, through its zmq loop, against a client that names 2,000 models nobody
serves and sends SUBMITs the broker cannot validate: each is answered, /metrics stays small, no
traceback reaches the log, and the next valid request is served."""

from __future__ import annotations

import socket
import urllib.request

import pytest
import zmq

from ovpool.client import Client
from ovpool.protocol import Error, Submit, decode, encode, recv_frames, send_frames
from ovpool.testing.pool import broker, fast_heartbeats, free_endpoint, null_worker, wait_for_workers

MODEL = "served-model"


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(sock: zmq.Socket, count: int) -> list[Error]:
    """The next ``count`` replies (each within 30 s)."""
    replies = []
    while len(replies) < count:
        assert sock.poll(30_000), f"the broker answered {len(replies)} of {count}"
        replies.append(decode(recv_frames(sock)))
    return replies


@pytest.mark.slow
def test_unknown_models_and_invalid_submits_are_answered_and_cost_metrics_nothing(tmp_path):
    endpoint, port, log = free_endpoint(), free_port(), tmp_path / "broker.log"
    with fast_heartbeats(0.2), broker(endpoint, "--metrics-port", str(port), log=log), \
            null_worker(endpoint, model=MODEL, slots=2), Client(endpoint) as client:
        wait_for_workers(client, 1)
        client.complete("warm", model=MODEL, max_tokens=2)
        before = len(metrics_text(port))
        context = zmq.Context()
        sock = context.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(endpoint)
        try:
            for i in range(2000):
                send_frames(sock, encode(Submit(f"u{i}", f"nope-{i}", {"max_tokens": 2}, prompt="hi")))
            unknown = answers(sock, 2000)
            schema = {"type": "json_schema", "schema": {"type": b"string"}}  # bytes inside a schema
            send_frames(sock, encode(Submit("bytes", MODEL, {"response_format": schema}, prompt="hi")))
            (invalid,) = answers(sock, 1)
        finally:
            sock.close()
            context.term()
        after = client.complete("after", model=MODEL, max_tokens=3)
        text = metrics_text(port)
    assert {m.code for m in unknown} == {"request.model_not_found"}
    assert invalid.request_id == "bytes" and "response_format" in invalid.message
    assert len(text) - before < 4096 and "nope-" not in text, f"/metrics: {before} bytes, then {len(text)}"
    assert after.usage.completion_tokens == 3
    assert "Traceback" not in log.read_text()
