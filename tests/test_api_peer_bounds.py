"""A hostile HTTP peer against a real `ovpool api` process (ovpool/api/peer_bounds.py): an endless
URL or header is refused at MAX_HEAD_BYTES (before, the API held all of it: 152 MB sent made
its RSS 309 MB), a request sent slowly, or a connection that sends nothing, is closed after
HTTP_READ_TIMEOUT_S (before, for ever) with an answer that says why, and a response nobody reads
is cut after HTTP_WRITE_STALL_S; honest clients, keep-alive connections, large bodies and
streams longer than those timeouts are served."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest
from serve_helpers import wait_for

from ovpool import timing
from ovpool.api.peer_bounds import MAX_HEAD_BYTES
from ovpool.testing.pool import PoolProcess, broker, fast_heartbeats, free_endpoint, null_worker

pytestmark = pytest.mark.slow  # processes

_SLACK_S = 5.0


@pytest.fixture(scope="module")
def api():
    """(host, port, pid, HTTP_READ_TIMEOUT_S) of an API process with a broker and two null workers
    behind it: model null at 0.1 s a token, model fast at once."""
    endpoint, port = free_endpoint(), int(free_endpoint().rsplit(":", 1)[1])
    with fast_heartbeats(0.1), broker(endpoint), null_worker(endpoint, token_delay=0.1), \
            null_worker(endpoint, model="fast"), \
            PoolProcess("api", "--broker", endpoint, "--bind", f"127.0.0.1:{port}") as process:
        wait_for(lambda: _health(port) == 200, 60, "the API and its worker")
        yield "127.0.0.1", port, process.proc.pid, timing.HTTP_READ_TIMEOUT_S  # 6 s here


def _health(port: int) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code
    except httpx.TransportError:
        return None


def _rss_kb(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS"))
    return int(line.split()[1])


def _answer(sock: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of the one answer before the server closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _flood(sock: socket.socket, start: bytes, filler: bytes, most: int) -> int:
    """Send ``start`` then ``filler`` until the server closes or ``most`` bytes went; bytes sent."""
    sent = 0
    try:
        sock.sendall(start)
        while sent < most:
            sock.sendall(filler)
            sent += len(filler)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return sent


@pytest.mark.parametrize("start, filler", [
    (b"GET /", b"a" * 65536),  # an endless URL
    (b"GET /health HTTP/1.1\r\nHost: x\r\n", b"X-Junk: " + b"a" * 990 + b"\r\n"),  # endless headers
    (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Junk: ", b"a" * 65536),  # one endless header
])
def test_a_head_over_the_cap_is_refused_431_and_memory_stays_bounded(api, start, filler):
    host, port, pid, _ = api
    before = _rss_kb(pid)
    with socket.create_connection((host, port)) as sock:
        sent = _flood(sock, start, filler, 64 << 20)
        status, body = _answer(sock)
    assert status == 431
    assert body["error"]["message"] == (
        f"the request line and headers are over {MAX_HEAD_BYTES:,} bytes, the most this API reads; send a"
        " shorter URL and fewer or shorter headers")
    assert sent < 16 << 20  # closed long before the 64 MB were sent (socket buffers hold a few MB)
    assert _rss_kb(pid) - before < 32 << 10  # kB; without the cap it grew by what was sent
    assert _health(port) == 200


@pytest.mark.parametrize("start, trickle", [
    (b"", b""),  # connects and sends nothing
    (b"GET /health HTTP/1.1\r\n", b"X"),  # a header a byte at a time
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
     b'Content-Length: 900\r\n\r\n{"model": "null", "prompt": "', b"a"),  # a body a byte at a time
])
def test_a_request_sent_too_slowly_is_answered_408_and_closed(api, start, trickle):
    host, port, _, timeout_s = api
    with socket.create_connection((host, port)) as sock:
        started = time.monotonic()
        sock.sendall(start)
        while trickle and time.monotonic() - started < timeout_s + _SLACK_S:
            try:
                sock.sendall(trickle)
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.5)  # a byte now and then: each would cancel uvicorn's keep-alive timeout
        sock.settimeout(60)  # a guard against a hang, not a timing claim
        status, body = _answer(sock)
        seconds = time.monotonic() - started
    assert status == 408 and body["error"]["message"] == (
        f"the request did not arrive whole within {timeout_s:g} s of the connection being ready for it;"
        " send it at once")
    assert timeout_s - 0.5 <= seconds  # its clock starts at the accept
    assert _health(port) == 200


def test_keep_alive_large_bodies_and_a_stream_longer_than_the_timeout_are_served(api):
    host, port, _, timeout_s = api
    body = {"model": "null", "prompt": "x" * 1_000_000, "max_tokens": 2}  # a ~1 MB body, many reads
    with httpx.Client(base_url=f"http://{host}:{port}", timeout=120) as http:
        assert http.post("/v1/completions", json=body).status_code == 200
        tokens = int(timeout_s / 0.1) + 20  # ~8 s of tokens at 0.1 s each, past the 6 s timeout
        streamed = {"model": "null", "prompt": "p", "max_tokens": tokens, "stream": True}
        with http.stream("POST", "/v1/completions", json=streamed) as stream:
            assert stream.status_code == 200
            chunks = [json.loads(x[6:]) for x in stream.iter_lines() if x.startswith("data: {")]
        assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * tokens + ["length"]
        time.sleep(1.0)  # idle on the same connection (below uvicorn's 5 s keep-alive), then again
        assert http.post("/v1/completions", json=body).status_code == 200
        assert http.get("/health").status_code == 200


def test_a_kept_alive_connection_closes_only_after_uvicorns_keep_alive_timeout_idle(api):
    """uvicorn's keep-alive timeout (5 s), kept here by the connection's one timer: a connection
    whose requests come sooner lives on past it; once idle that long, it is closed, unanswered."""
    host, port, _, _ = api
    with socket.create_connection((host, port)) as sock:
        sock.settimeout(60)  # a guard against a hang, not a timing claim
        for _ in range(5):  # 6 s of requests, 1.5 s apart
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _one_response(sock).startswith(b"HTTP/1.1 200")
            answered = time.monotonic()
            time.sleep(1.5)
        assert sock.recv(1 << 16) == b""
        idle = time.monotonic() - answered
    assert 4.0 <= idle <= 5.0 + _SLACK_S


def _one_response(sock: socket.socket) -> bytes:
    """One response (head and Content-Length body) from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += _more(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    while len(body) < length:
        body += _more(sock)
    return head + b"\r\n\r\n" + body


def _more(sock: socket.socket) -> bytes:
    if not (data := sock.recv(1 << 16)):
        raise AssertionError("the server closed the connection before its answer")
    return data


def test_a_response_the_client_takes_none_of_is_cut_and_memory_stays_bounded(api):
    """A client that sends a streamed request and then reads nothing: the API's sends wait at the
    transport's high-water mark (memory stays put), and after HTTP_WRITE_STALL_S of that the
    connection is aborted (before, it was held for as long as the client kept it open, the
    stream's sends waiting, and delivered whole once it read)."""
    host, port, pid, _ = api
    # 16 x 4,096 tokens, ~13 MB of events: more than the kernel's socket buffers take
    body = json.dumps({"model": "fast", "prompt": "p", "max_tokens": 4096, "n": 16, "stream": True}).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
        sock.connect((host, port))
        before = _rss_kb(pid)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        started = time.monotonic()
        time.sleep(timing.HTTP_WRITE_STALL_S + _SLACK_S)  # reads nothing meanwhile
        grown = _rss_kb(pid) - before
        data, ended = b"", False
        sock.settimeout(_SLACK_S)
        try:
            while chunk := sock.recv(1 << 16):
                data += chunk
            ended = True
        except ConnectionResetError:  # the abort's RST
            ended = True
        except TimeoutError:
            pass
        seconds = time.monotonic() - started
    assert ended, f"the connection was still open {seconds:.0f} s after the client stopped reading"
    assert data.startswith(b"HTTP/1.1 200 OK") and b"data: [DONE]" not in data
    assert grown < 16 << 10  # kB: what waits for the client is bounded by the high-water mark
    assert _health(port) == 200
