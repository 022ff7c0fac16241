"""uvicorn's HTTP protocol, with what a response writes in one turn of the event loop sent as one.

uvicorn writes a response's head when the app sends ``http.response.start`` and its body at
``http.response.body``, and uvloop sends each at once: two syscalls and two TCP segments, so the
client reads twice too. ``Http`` hands the protocol a transport that gathers the writes of one
turn and sends them together at its end (or before a close). Nothing else changes: flow control,
closing and the socket's details are the transport's own. Figures: docs/performance.md, HTTP API
overhead.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ovpool.api.peer_bounds import BoundedPeer


class OneWrite:
    """``transport``, with the writes of one loop turn joined into one write."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []
        self.is_closing = transport.is_closing  # asked a few times a request: not via __getattr__

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def write_eof(self) -> None:
        self.flush()  # what waits goes first, as everything below that ends the output
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def __getattr__(self, name: str) -> Any:  # the rest of the transport's interface, unchanged
        return getattr(self._transport, name)


class Http(BoundedPeer):
    """uvicorn's httptools protocol, bounded (peer_bounds.py), on a OneWrite transport
    (uvicorn.Config's ``http``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(OneWrite(transport, self.loop))  # type: ignore[arg-type]
