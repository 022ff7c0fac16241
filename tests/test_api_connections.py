"""How many connections the HTTP API holds (ovpool/api/peer_bounds.py, setting max_connections).

Against a real `ovpool api` process: a peer that opens many connections gets those over the cap
answered 503 with Retry-After and closed, while the API's descriptors stay within the cap and a
stream already under way goes on; once they close, new clients are served. Before the cap every
connection was held (10,000 idle ones: 10,000 descriptors, and at the descriptor limit an honest
client was cut without an answer: docs/operations.md, "Connections"). Counts are the kernel's
(/proc/net/tcp), waited for, never timed.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import socket
from pathlib import Path

import httpx
import pytest
from serve_helpers import wait_for

from ovpool.api.peer_bounds import RESERVED_FDS, ConnectionCap, fit_descriptors
from ovpool.errors import ConfigError
from ovpool.testing.pool import PoolProcess, broker, free_endpoint, null_worker

CAP, FLOOD = 40, 400
TOKENS, READ = 2000, 40  # a stream of 100 s at 0.05 s a token: open through the flood
_HELD = {"01", "08"}  # ESTABLISHED, CLOSE_WAIT: a connection the server has not closed
_REFUSAL = (f"this HTTP API holds as many connections open as it may ({CAP:,}, setting max_connections);"
            " retry shortly, and reuse connections (keep-alive)")


def _held(port: int) -> int:
    """Server-side TCP connections on ``port`` that the API has not closed (accepted or not yet)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, _, state = line.split()[1:4]
            count += int(local.rsplit(":", 1)[1], 16) == port and state in _HELD
    return count


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _answer(sock: socket.socket) -> tuple[bytes, dict]:
    """The head and JSON body of the one answer before the server closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head, json.loads(body)


@pytest.mark.slow  # processes
def test_connections_over_the_cap_are_refused_503_and_a_running_stream_goes_on(tmp_path):
    endpoint, port = free_endpoint(), int(free_endpoint().rsplit(":", 1)[1])
    base = f"http://127.0.0.1:{port}"
    with broker(endpoint), null_worker(endpoint, token_delay=0.05), \
            PoolProcess("api", "--broker", endpoint, "--bind", f"127.0.0.1:{port}", "--set",
                        f"max_connections={CAP}", log=tmp_path / "api.log") as api, \
            httpx.Client(base_url=base, timeout=60) as http:
        wait_for(lambda: _ready(base), 60, "the API and its worker")
        wait_for(lambda: _held(port) == 0, 60, "the readiness probes' connections to close")
        idle_fds = _fds(api.proc.pid)
        body = {"model": "null", "prompt": "p", "max_tokens": TOKENS, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as stream:
            lines = (json.loads(x[6:]) for x in stream.iter_lines() if x.startswith("data: {"))
            next(lines)  # under way: its connection is one of the CAP
            held = [socket.create_connection(("127.0.0.1", port)) for _ in range(CAP - 1)]
            wait_for(lambda: _held(port) == CAP, 60, "the held connections")
            for _ in range(FLOOD):  # each answered and closed before the next opens
                with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
                    head, refused = _answer(sock)
                assert head.startswith(b"HTTP/1.1 503 ") and b"\r\nretry-after: 1\r\n" in head
                assert refused["error"]["message"] == _REFUSAL
            # Without the cap: idle_fds + CAP + FLOOD. A few more than CAP: ZeroMQ's own may come and go.
            assert _fds(api.proc.pid) <= idle_fds + CAP + 8
            assert [next(lines)["choices"][0]["finish_reason"] for _ in range(READ)] == [None] * READ
        for sock in held:
            sock.close()
        wait_for(lambda: _held(port) == 0, 60, "the held connections and the stream's to close")
        assert httpx.get(f"{base}/health", timeout=60).status_code == 200
    log = (tmp_path / "api.log").read_text()
    assert log.count(f"refused a connection over max_connections={CAP}") == 1  # a flood is one line


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=30).status_code == 200
    except httpx.TransportError:
        return False


def test_the_cap_raises_the_soft_descriptor_limit_within_the_hard_one():
    inf = resource.RLIM_INFINITY
    assert fit_descriptors(1024, 4096, 4096) == (1024, 4096)  # fits already
    assert fit_descriptors(1024, 1024, 8192) == (1024, 1024 + RESERVED_FDS)
    assert fit_descriptors(1024, 1024, inf) == (1024, 1024 + RESERVED_FDS)
    assert fit_descriptors(1024, inf, inf) == (1024, inf)
    assert fit_descriptors(1024, 256, 512) == (512 - RESERVED_FDS, 512)  # as many as the hard one allows
    with pytest.raises(ConfigError, match=r"file descriptor limit \(ulimit -n: 64\) leaves no room"):
        fit_descriptors(1024, 64, RESERVED_FDS)


def test_refusals_are_counted_and_logged_once_a_minute(caplog):
    cap = ConnectionCap(limit=2)
    with caplog.at_level(logging.WARNING, logger="ovpool.api.peer_bounds"):
        opened = [(1, 0.0), (2, 0.0), (3, 0.0), (3, 59.0), (3, 60.0), (2, 61.0)]  # (open with it, time)
        admitted = [cap.admits(n, t) for n, t in opened]
    assert admitted == [True, True, False, False, False, True]
    assert cap.refused == 3
    assert [r.getMessage() for r in caplog.records] == [
        f"refused a connection over max_connections=2 ({n} refused so far): a client holds many open, or"
        " raise the setting" for n in (1, 3)]
