"""What one HTTP connection may make the API hold and wait for, below the app: uvicorn bounds
none of it. A request's head (request line and headers) is at most MAX_HEAD_BYTES (431 past it: the
parser would otherwise hold an endless URL or header in memory), and a request, head and body,
arrives within timing.HTTP_READ_TIMEOUT_S of the connection opening or the previous response
ending (408 past it: uvicorn times no head, and a byte now and then cancels its keep-alive
timeout, so a slow sender could hold a connection, and with enough of them every descriptor).
A response the client takes none of for timing.HTTP_WRITE_STALL_S (its writes paused at the
transport's high-water mark all along) is cut: the connection is aborted, and the app's send
returns as for a client that left. The wait for the app's own response is not bounded here.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ovpool import timing
from ovpool.api.errors import http_body

MAX_HEAD_BYTES = 64 * 1024  # as much as nginx's default large_client_header_buffers, twice over


class BoundedPeer(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds above (a connection's state is its own)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_head, self._head_bytes, self._message_done, self._ended_a_part = True, 0, False, False
        self._read_deadline: float | None = None  # the read clock: running while set
        self._read_watch: asyncio.TimerHandle | None = None  # its one timer (_check_read)
        self._write_timer: asyncio.TimerHandle | None = None
        self._time_the_read()

    def connection_lost(self, exc: Exception | None) -> None:
        self._read_deadline, self._read_watch = None, _cancelled(self._read_watch)
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
        self._ended_a_part = False
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
        super().on_response_complete()
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
            if self._read_watch is None:
                self._read_watch = self.loop.call_at(self._read_deadline, self._check_read)

    def _check_read(self) -> None:
        """The read clock's one timer: at a deadline it answers 408, before one (the clock stopped
        and started again since it was set) it waits for that one, so that a request on a kept-alive
        connection sets no timer of its own (one each was a measurable share of the API's CPU)."""
        self._read_watch, deadline = None, self._read_deadline
        if deadline is None or self.transport.is_closing():
            return
        if self.loop.time() < deadline:
            self._read_watch = self.loop.call_at(deadline, self._check_read)
            return
        self._read_deadline = None
        self._refuse(408, f"the request did not arrive whole within {timing.HTTP_READ_TIMEOUT_S:g} s"
                          " of the connection being ready for it; send it at once")

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` with ``message`` in the API's error JSON, and close the connection
        (an app waiting on the body sees the client gone)."""
        body = json.dumps(http_body(status, message)).encode()
        self.transport.write(b"".join([
            STATUS_LINE[status], b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body]))
        self.transport.close()


def _cancelled(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()
