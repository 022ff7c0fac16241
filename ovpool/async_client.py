"""AsyncClient: the Client API as coroutines and async iterators (zmq.asyncio, one event loop).

``async with AsyncClient(endpoint) as c: await c.complete("Hi")``. One reader task delivers
replies and one timer task pings and enforces deadlines; the DEALER is read and written without a
zmq future per message (its plain twin, on the event loop's readiness of its file descriptor: a
future per message was ~45% of the HTTP API's CPU per request); the protocol logic is PendingRequests,
shared with the threaded Client, and so is the flow control (ovpool.stream_reader: a stream's
reader returns credit as it takes tokens; ``aclose()`` cancels what is left).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from ovpool import errors, timing
from ovpool.client_link import ClientLink, LinkState
from ovpool.completion import Completion, Delta
from ovpool.protocol import Cancel, Drain, Message, ModelOrder, Status, Submit, recv_frames, send_frames
from ovpool.sampling_params import SamplingParams
from ovpool.settings import Settings
from ovpool.sinks import FutureSink
from ovpool.stream_reader import STREAM_WINDOW, StreamBase, StreamReader, StreamSink, unwrap

# Plain ints: pyzmq's flags and options are IntFlags, whose arithmetic costs more than the call.
_NOBLOCK, _EVENTS, _POLLIN = int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN)


class AsyncStream(StreamBase):
    """One streamed request as an async iterator of Deltas (see StreamBase)."""

    _deltas: AsyncIterator[Delta]

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._deltas

    def __anext__(self) -> Any:
        return self._deltas.__anext__()

    async def aclose(self) -> None:
        """Stop reading; cancels the request unless it has ended."""
        await self._deltas.aclose()


class AsyncClient:
    def __init__(self, broker: str | None = None, *, model: str = "", timeout: float | None = None,
                 settings: Settings | dict | None = None):
        self._link = ClientLink(broker, model, timeout, settings, zmq.asyncio.Context())
        # The DEALER's plain twin: non-blocking sends and receives return at once, no future each.
        self._raw = zmq.Socket.shadow(self._link.socket.underlying)
        self._readable = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._outbox: list[list[bytes]] = []  # encoded, to leave at the end of this loop turn

    async def __aenter__(self) -> AsyncClient:
        coros = (self._read(self._raw), self._timers(), self._watch(self._link.monitor))
        self._tasks = [self._task(coro) for coro in coros]
        return self

    def _task(self, coro: Any) -> asyncio.Task:
        task = asyncio.create_task(coro)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        """A task of the I/O loop ended: by aclose (cancelled), or by a bug that must not leave
        anyone waiting (ClientLink.loop_failed)."""
        if task not in self._tasks:  # the reader or watcher of a socket left in a failover
            return
        if not task.cancelled() and task.exception() is not None and not self._link.stopped:
            self._link.loop_failed(task.exception())

    @property
    def healthy(self) -> bool:
        """Whether this client can take requests: its I/O loop runs (False once closed)."""
        return self._reading()

    def link_state(self) -> LinkState:
        return self._link.state(self._reading())

    def _reading(self) -> bool:
        return bool(self._tasks) and not any(task.done() for task in self._tasks)

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel what is still outstanding (freeing its slots and queue places at once), fail its
        futures and streams, and release the socket."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # one may have failed: said already
        self._tasks = []
        left = self._link.pending.close()
        self._send(left)
        self._flush()
        self._link.socket.disable_monitor()
        self._link.monitor.close()
        # Long enough for the CANCELs to leave on a live connection, never long on a dead one.
        self._link.socket.close(linger=int(timing.HEARTBEAT_INTERVAL_S * 1000) if left else 0)
        self._link.context.term()

    def submit(self, prompt: str | list, *, model: str | None = None, timeout: float | None = None,
               params: SamplingParams | None = None, **sampling: Any) -> asyncio.Future:
        """Send a request now; await the returned Future for the Completion (sampling as Client.submit)."""
        msg = self._link.submit_msg(prompt, model, timeout, sampling, params=params)
        future = asyncio.get_running_loop().create_future()
        future.request_id = msg.request_id
        self._start(msg, FutureSink(future))
        return future

    async def complete(self, prompt: str, **kwargs: Any) -> Completion:
        return await self.submit(prompt, **kwargs)

    async def chat(self, messages: list[dict[str, str]], **kwargs: Any) -> Completion:
        return await self.submit(messages, **kwargs)

    def stream(self, prompt: str | list, *, model: str | None = None, timeout: float | None = None,
               params: SamplingParams | None = None, **sampling: Any) -> AsyncStream:
        """``async for delta in client.stream(...)``; leaving the loop early (or ``aclose()``)
        cancels the request; ``.completion`` is the finished Completion once the loop ended."""
        msg = self._link.submit_msg(prompt, model, timeout, sampling, STREAM_WINDOW, params)
        items: asyncio.Queue = asyncio.Queue()
        reader = StreamReader(msg.request_id, StreamSink(items.put_nowait), STREAM_WINDOW)
        self._start(msg, reader.sink)
        return AsyncStream(reader, self._iterate(reader, items))

    async def _iterate(self, reader: StreamReader, items: asyncio.Queue) -> AsyncIterator[Delta]:
        try:
            while (delta := unwrap(await items.get())) is not None:
                yield delta
                self._send(reader.credit())
        finally:
            if reader.left_early:
                self._send(self._link.pending.abandon(reader.request_id))

    async def cancel(self, request: str | asyncio.Future) -> None:
        self._send([Cancel(getattr(request, "request_id", request))])

    async def status(self, timeout: float = 10.0, ask_with: Message | None = None) -> dict:
        """The broker's STATUS (``ask_with``: another command it answers with one, e.g. DRAIN)."""
        self._link.check_reading()
        future = asyncio.get_running_loop().create_future()
        ask = ask_with or Status()
        self._link.pending.add_status_waiter(FutureSink(future), time.monotonic(), ask)
        self._send([ask])
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError as exc:
            raise errors.BrokerUnavailableError(
                f"no status reply from {self._link.broker} in {timeout}s") from exc

    def give_up(self, exc: errors.OvpoolError) -> None:
        """Fail every request still outstanding with ``exc`` and cancel it at the broker (an HTTP
        API whose drain ran out of time: its clients read why, never a cut connection)."""
        self._send(self._link.pending.close(exc))

    async def drain(self, worker: str = "", timeout_s: float = 30.0, timeout: float = 10.0) -> dict:
        """As Client.drain."""
        return await self.status(timeout, Drain(worker, timeout_s))

    async def model_order(self, model: str, action: str, timeout: float = 10.0) -> dict:
        """Ask the serve that loads ``model`` on demand to ``action`` ("load", "unload") it
        (protocol.ModelOrder); the broker's status after it."""
        return await self.status(timeout, ModelOrder(model, action))

    def _start(self, msg: Submit, sink: Any) -> None:
        if not self._tasks:
            raise errors.BrokerUnavailableError("use `async with AsyncClient(...)` before sending")
        self._send(self._link.track(msg, sink, time.monotonic()))

    def _send(self, msgs: list[Message]) -> None:
        """Encoded now (one that cannot be fails at once), sent with the others of this turn of
        the event loop: libzmq then wakes its I/O thread about once per turn, not per message."""
        for msg in msgs:
            if (frames := self._link.encoded(msg)) is not None:
                if not self._outbox:
                    asyncio.get_running_loop().call_soon(self._flush)
                self._outbox.append(frames)

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        for frames in outbox:
            with contextlib.suppress(zmq.Again):
                send_frames(self._raw, frames, _NOBLOCK)
        if outbox:
            self._check_readable()

    def _check_readable(self) -> None:
        """The DEALER's descriptor signals edges, and libzmq may take in a message while it sends:
        whether one waits is its EVENTS."""
        if self._raw.get(_EVENTS) & _POLLIN:
            self._readable.set()

    async def _read(self, raw: zmq.Socket) -> None:
        loop, fd = asyncio.get_running_loop(), raw.get(zmq.FD)
        loop.add_reader(fd, self._readable.set)
        self._readable.set()  # whatever arrived before the reader was added
        try:
            while True:
                await self._readable.wait()
                self._readable.clear()
                if self._drain():
                    self._readable.set()
                    await asyncio.sleep(0)  # a flood of replies lets the loop's other tasks run
                self._check_readable()  # what came in since (reading EVENTS re-arms the descriptor)
        finally:
            if raw is self._raw:  # after a failover that fd may be the new socket's
                loop.remove_reader(fd)

    def _drain(self, most: int = 256) -> bool:
        """Handle the messages waiting, up to ``most``; whether it stopped at ``most``."""
        for _ in range(most):
            try:
                frames = recv_frames(self._raw)
            except zmq.Again:
                return False
            self._send(self._link.on_frames(frames, time.monotonic()))
        return True

    async def _timers(self) -> None:
        while True:
            self._send(self._link.pending.tick(time.monotonic()))
            if self._link.pending.wants_failover(time.monotonic()):
                self._fail_over()
            await asyncio.sleep(timing.POLL_INTERVAL_S)

    def _fail_over(self) -> None:
        """A new socket: the old one's reader and watcher stop first (run from the timer task)."""
        self._flush()  # what was sent before goes where it was sent to
        asyncio.get_running_loop().remove_reader(self._raw.get(zmq.FD))
        reader, timers, watcher = self._tasks
        self._tasks = [timers]
        reader.cancel()
        watcher.cancel()
        resend = self._link.switch(time.monotonic())
        self._raw = zmq.Socket.shadow(self._link.socket.underlying)
        self._tasks = [self._task(self._read(self._raw)), timers, self._task(self._watch(self._link.monitor))]
        self._send(resend)

    async def _watch(self, monitor: zmq.Socket) -> None:
        while True:
            self._link.on_monitor(await recv_monitor_message(monitor), time.monotonic())
