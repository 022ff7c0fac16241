"""Asyncio plumbing of the HTTP API: the n streams of one request read as one, and waiting on
the pool while watching for the HTTP client to go away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from starlette.requests import Request

from ovpool import errors, timing
from ovpool.async_client import AsyncStream
from ovpool.completion import Completion, Delta

_READ_AHEAD = 4  # items per stream between the pool and the HTTP response


class ClientGone(Exception):
    """The HTTP client disconnected before its answer was ready."""


class Disconnects:
    """Requests waiting for the pool, checked for a departed client every POLL_INTERVAL_S by one
    task (``run``), which calls the request's ``on_gone``. A task per request that waits on
    ``receive`` cost ~50 us of CPU per request here, a fifth of the API's; this costs a dict
    entry and a check per sweep (``_gone``), and answers within a tenth of a heartbeat."""

    def __init__(self) -> None:
        self._waiting: dict[int, tuple[Request, Callable[[], None]]] = {}

    def watch(self, request: Request, on_gone: Callable[[], None]) -> _Watch:
        """``with disconnects.watch(request, on_gone):`` the request is checked while in the block."""
        return _Watch(self._waiting, request, on_gone)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(timing.POLL_INTERVAL_S)
            for key, (request, on_gone) in list(self._waiting.items()):
                if _gone(request.receive):
                    self._waiting.pop(key, None)
                    on_gone()


def _gone(receive: Callable) -> bool:
    """Whether the ASGI server says the client left, asked without waiting: ``receive`` answers at
    once when it has a message (uvicorn: http.disconnect once the client is gone), and is dropped
    where it would wait. Starlette's ``Request.is_disconnected`` does the same inside an anyio
    cancel scope, at many times the CPU (docs/performance.md, HTTP API overhead)."""
    answer = receive().__await__()
    try:
        answer.send(None)
    except StopIteration as answered:
        return answered.value.get("type") == "http.disconnect"
    answer.close()
    return False


class _Watch:
    """Disconnects.watch's block: a class, not @contextmanager, whose generator costs ~1 us more
    per request."""

    __slots__ = ("_waiting", "_key", "_entry")

    def __init__(self, waiting: dict, request: Request, on_gone: Callable[[], None]):
        self._waiting, self._key, self._entry = waiting, id(request), (request, on_gone)

    def __enter__(self) -> None:
        self._waiting[self._key] = self._entry

    def __exit__(self, *exc: object) -> None:
        self._waiting.pop(self._key, None)


def fail_pending(futures: list[asyncio.Future], exc: Exception) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(exc)


class Merged:
    """Several AsyncStreams as one async iterator of ``(choice index, item)``: each Delta as it
    comes, then the stream's Completion, or the OvpoolError it failed with instead.

    The queue between them is short, so a slow HTTP reader stops the pumps, which stop taking
    tokens from their streams, which return no credit to the broker: the pool's flow control
    reaches the HTTP client instead of tokens piling up here."""

    def __init__(self, streams: dict[int, AsyncStream]):
        self._queue: asyncio.Queue = asyncio.Queue(maxsize=_READ_AHEAD * len(streams))
        self._open = len(streams)
        self._tasks = [asyncio.create_task(self._pump(i, s)) for i, s in streams.items()]

    async def _pump(self, index: int, stream: AsyncStream) -> None:
        put = self._queue.put
        try:
            async for delta in stream:
                await put((index, delta))
            await put((index, stream.completion))
        except errors.OvpoolError as exc:
            await put((index, exc))

    def __aiter__(self) -> Merged:
        return self

    async def __anext__(self) -> tuple[int, Delta | Completion | errors.OvpoolError]:
        if not self._open:
            raise StopAsyncIteration
        index, item = await self._queue.get()
        if isinstance(item, ClientGone):
            raise item
        if not isinstance(item, Delta):
            self._open -= 1
        return index, item

    def client_gone(self) -> None:
        """The HTTP client left: the next ``__anext__`` raises ClientGone (a full queue means the
        stream is about to start, and the HTTP server's own disconnect check takes over)."""
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait((-1, ClientGone()))

    async def aclose(self) -> None:
        """Cancel the streams still running (each sends its CANCEL as it stops)."""
        for task in self._tasks:
            task.cancel()  # at once, so that a cancelled caller cannot leave one running
        await asyncio.gather(*self._tasks, return_exceptions=True)
