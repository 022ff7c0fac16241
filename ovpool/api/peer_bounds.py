"""What one HTTP connection may make the API hold and wait for, below the app: uvicorn bounds
none of it. A request's head (request line and headers) is at most MAX_HEAD_BYTES (431 past it: the
parser would otherwise hold an endless URL or header in memory), and a request, head and body,
arrives within timing.HTTP_READ_TIMEOUT_S of the connection opening or the previous response
ending (408 past it: uvicorn times no head, and a byte now and then cancels its keep-alive
timeout, so a slow sender could hold a connection, and with enough of them every descriptor).
A connection kept alive and idle after a response is closed after uvicorn's timeout_keep_alive, as
uvicorn does, but by a deadline of the connection's one timer, the read clock's, not by a timer of
its own set and cancelled for every response (a share of the API's CPU per request).
A response the client takes none of for timing.HTTP_WRITE_STALL_S (its writes paused at the
transport's high-water mark all along) is cut: the connection is aborted, and the app's send
returns as for a client that left. The wait for the app's own response is not bounded here.
At most ``ConnectionCap.limit`` connections are held open (setting max_connections; uvicorn's
limit_concurrency only answers requests 503 and still holds every connection): one more is answered
503 with Retry-After and closed at once, so a peer that opens thousands keeps the process within
its descriptors (at the limit, accept fails and even honest clients are cut without an answer).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import resource
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ovpool import timing
from ovpool.api.errors import http_body
from ovpool.errors import ConfigError

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024  # as much as nginx's default large_client_header_buffers, twice over
# Descriptors the process needs beside its client connections: ZeroMQ's sockets and pipes, the
# listening socket, logs (21 open in an idle API), with room for a broker pair's reconnects.
RESERVED_FDS = 64


@dataclass
class ConnectionCap:
    """The most client connections held open, and those refused (logged at most once a
    ``log_every_s``, with the count: a flood is one line, not one a connection)."""

    limit: int
    log_every_s: float = 60.0
    refused: int = 0
    _logged_at: float = -math.inf

    def admits(self, open_now: int, now: float) -> bool:
        """Whether a connection that makes ``open_now`` open (itself included) is kept."""
        if open_now <= self.limit:
            return True
        self.refused += 1
        if now - self._logged_at >= self.log_every_s:
            self._logged_at = now
            log.warning("refused a connection over max_connections=%d (%d refused so far): a client "
                        "holds many open, or raise the setting", self.limit, self.refused)
        return False


def fit_descriptors(wanted: int, soft: int, hard: int) -> tuple[int, int]:
    """(the connection cap, the soft descriptor limit to set) for ``wanted`` connections: the soft
    limit raised to fit them with RESERVED_FDS, within the hard one; if it cannot, as many as fit."""
    need = wanted + RESERVED_FDS
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted, soft
    new_soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
    cap = min(wanted, new_soft - RESERVED_FDS)
    if cap < 1:
        raise ConfigError(f"the HTTP API's file descriptor limit (ulimit -n: {hard}) leaves no room for a "
                          f"client connection beside the {RESERVED_FDS} it keeps for itself; raise it")
    return cap, new_soft


def connection_cap(wanted: int) -> ConnectionCap:
    """The cap for setting max_connections, with this process's descriptor limit raised to fit it
    (a warning says when the hard limit makes the cap lower)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap, new_soft = fit_descriptors(wanted, soft, hard)
    if new_soft != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
    if cap < wanted:
        log.warning("max_connections=%d does not fit the file descriptor limit (ulimit -n: hard %d): the "
                    "HTTP API holds at most %d connections; raise the hard limit for more", wanted, hard, cap)
    return ConnectionCap(cap)


class BoundedPeer(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds above (a connection's state is its own);
    ``cap``: the server's ConnectionCap, shared by its connections (None: no cap)."""

    def __init__(self, *args: Any, cap: ConnectionCap | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cap = cap

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_head, self._head_bytes, self._message_done, self._ended_a_part = True, 0, False, False
        self._read_deadline: float | None = None  # the read clock: running while set
        self._idle_deadline: float | None = None  # keep-alive: set while idle after a response
        self._read_watch: asyncio.TimerHandle | None = None  # the one timer of both (_check_read)
        self._watch_at = 0.0  # when it runs
        self._write_timer: asyncio.TimerHandle | None = None
        if self.cap is not None and not self.cap.admits(len(self.connections), self.loop.time()):
            self._refuse(503, f"this HTTP API holds as many connections open as it may ({self.cap.limit:,},"
                              " setting max_connections); retry shortly, and reuse connections (keep-alive)",
                         b"retry-after: 1\r\n")
            return
        self._time_the_read()

    def connection_lost(self, exc: Exception | None) -> None:
        self._read_deadline = self._idle_deadline = None
        self._read_watch = _cancelled(self._read_watch)
        self._write_timer = _cancelled(self._write_timer)
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(timing.HTTP_WRITE_STALL_S, self._write_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_timer = _cancelled(self._write_timer)

    def _write_stalled(self) -> None:
        """The client has taken nothing for HTTP_WRITE_STALL_S: close() would wait for it to read
        what is buffered, so abort (nothing more can reach it anyway)."""
        self._write_timer = None
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        self._ended_a_part, self._idle_deadline = False, None
        super().data_received(data)
        # A read that ends a head or a body is not counted (one read at most, what uvloop reads at
        # once); one that ends inside a head counts whole.
        if self._in_head and not self._ended_a_part and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse(431, f"the request line and headers are over {MAX_HEAD_BYTES:,} bytes, the"
                                  " most this API reads; send a shorter URL and fewer or shorter headers")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._message_done = False
        self._time_the_read()

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes, self._ended_a_part = False, 0, True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # What comes next is the next request's head.
        self._in_head, self._message_done, self._ended_a_part = True, True, True
        self._time_the_read()

    def on_response_complete(self) -> None:
        """uvicorn's, with its keep-alive timer a deadline of the connection's one timer."""
        self.server_state.total_requests += 1
        if not self.transport.is_closing():
            self.flow.resume_reading()
            if self.pipeline:
                self._start_asgi_task(*self.pipeline.pop())
            else:
                self._idle_deadline = self.loop.time() + self.timeout_keep_alive
                self._watch(self._idle_deadline)
        self._time_the_read()

    def _time_the_read(self) -> None:
        """The clock runs while the client owes bytes: a request's head or body, or the next
        request once the last one is answered; it stops only while the app answers a whole
        request, and a running clock keeps its deadline."""
        answering = self._message_done and self.cycle is not None and not self.cycle.response_complete
        if answering or self.transport.is_closing():
            self._read_deadline = None
        elif self._read_deadline is None:
            self._read_deadline = self.loop.time() + timing.HTTP_READ_TIMEOUT_S
            self._watch(self._read_deadline)

    def _watch(self, deadline: float) -> None:
        """The connection's one timer runs at ``deadline`` or before (then it waits on)."""
        if self._read_watch is None or self._watch_at > deadline:
            _cancelled(self._read_watch)
            self._watch_at, self._read_watch = deadline, self.loop.call_at(deadline, self._check_read)

    def _check_read(self) -> None:
        """The connection's one timer: past the keep-alive deadline it closes the idle connection
        (as uvicorn's timeout does, without an answer); past the read clock's it answers 408; before
        them (they moved since it was set) it waits for the next, so that a request on a kept-alive
        connection sets no timer of its own (one each was a measurable share of the API's CPU)."""
        self._read_watch, now = None, self.loop.time()
        if self.transport.is_closing():
            return
        if self._idle_deadline is not None and now >= self._idle_deadline:
            self.transport.close()
        elif self._read_deadline is not None and now >= self._read_deadline:
            self._read_deadline = None
            self._refuse(408, f"the request did not arrive whole within {timing.HTTP_READ_TIMEOUT_S:g} s"
                              " of the connection being ready for it; send it at once")
        elif pending := [d for d in (self._idle_deadline, self._read_deadline) if d is not None]:
            self._watch(min(pending))

    def _refuse(self, status: int, message: str, headers: bytes = b"") -> None:
        """Answer ``status`` with ``message`` in the API's error JSON, and close the connection
        (an app waiting on the body sees the client gone)."""
        body = json.dumps(http_body(status, message)).encode()
        self.transport.write(b"".join([
            STATUS_LINE[status], b"content-type: application/json\r\n", headers,
            b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body]))
        self.transport.close()


def _cancelled(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()
