"""The HTTP API's transport (ovpool/api/one_write.py): what a response writes in one turn of the
event loop leaves in one write, head and body together, and nothing is lost or reordered."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ovpool.api.one_write import Http, OneWrite


class _Recorder:
    """A transport that records what is written to it (and closes when told)."""

    def __init__(self, transport: Any = None):
        self.transport, self.writes, self.closed = transport, [], False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        if self.transport is not None:
            self.transport.write(data)

    def is_closing(self) -> bool:
        return self.closed if self.transport is None else self.transport.is_closing()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def get_write_buffer_size(self) -> int:
        return 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def test_writes_of_one_turn_leave_together_and_a_close_sends_what_waits_first():
    async def scenario() -> _Recorder:
        raw = _Recorder()
        one = OneWrite(raw, asyncio.get_running_loop())
        one.write(b"head ")
        one.write(b"body")
        assert raw.writes == [] and one.get_write_buffer_size() == 9
        await asyncio.sleep(0)
        assert raw.writes == [b"head body"]
        one.writelines([b"la", b"st"])  # in order with write's, never around them
        one.close()
        await asyncio.sleep(0)  # the flush it had scheduled finds nothing left
        return raw

    raw = asyncio.run(scenario())
    assert raw.writes == [b"head body", b"last"] and raw.closed


def test_each_response_of_a_served_app_is_one_write():
    writes: list[bytes] = []

    class Recorded(Http):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            recorder = _Recorder(transport)
            recorder.writes = writes
            super().connection_made(recorder)  # type: ignore[arg-type]

    async def chunks():
        for word in (b"a", b"b", b"c"):
            yield word
            await asyncio.sleep(0.01)  # a turn of its own each, as a stream's tokens come

    app = Starlette(routes=[Route("/json", lambda _: JSONResponse({"ok": 1})),
                            Route("/stream", lambda _: StreamingResponse(chunks()))])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, loop="uvloop", http=Recorded, lifespan="off",
                                           log_config=None, access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        while not server.started:
            threading.Event().wait(0.01)
        with httpx.Client(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}") as http:
            answers = [http.get("/json") for _ in range(3)]
            streamed = http.get("/stream")
    finally:
        server.should_exit = True
        thread.join()
        sock.close()
    assert [a.json() for a in answers] == [{"ok": 1}] * 3 and streamed.content == b"abc"
    assert len(writes) == 3 + 4  # each whole response one write; a stream's head, then its chunks
    assert all(w.startswith(b"HTTP/1.1 200 OK\r\n") and w.endswith(b'{"ok":1}') for w in writes[:3])
    assert writes[3].startswith(b"HTTP/1.1 200 OK\r\n") and writes[3].endswith(b"\r\n1\r\na\r\n")
