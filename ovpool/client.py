"""Client (threads) and AsyncClient (asyncio) for the broker.

Both talk to the broker through one DEALER socket and share ``PendingRequests`` for the protocol
logic and ovpool.stream_reader for a stream's. ``Client`` owns a background I/O thread (zmq
sockets are not thread-safe, so API calls hand it work through a queue and a wake-up pipe);
``AsyncClient`` runs the same in the event loop.
Remote errors are raised as the same ovpool error classes the broker or worker raised. Each holds
an ovpool.client_link.ClientLink, what they share: no message stops either's loop, and ``healthy`` /
``link_state()`` say whether it runs.

Flow control: a stream starts with ``STREAM_WINDOW`` tokens of credit and its reader returns half
of it each time it has taken that many, so the broker never sends a stream more than its reader
can hold. The I/O loop reads at most ``_READ_BATCH`` messages between its other duties (commands,
PINGs, deadlines) and stamps each batch with the time it was read, so a flood of tokens never
makes the client look silent, nor the broker look silent to it. Closing a client cancels every
request it leaves behind.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from ovpool import errors, timing
from ovpool.client_link import ClientLink, LinkState, dealer
from ovpool.completion import Completion, Delta
from ovpool.protocol import Cancel, Drain, Message, Status, Submit, Supervised, recv_frames, send_frames
from ovpool.sampling_params import SamplingParams
from ovpool.settings import Settings
from ovpool.sinks import FutureSink
from ovpool.stream_reader import STREAM_WINDOW, StreamBase, StreamReader, StreamSink, unwrap

__all__ = ["Client", "LinkState", "Stream", "dealer"]  # dealer and LinkState: from client_link

_READ_BATCH = 256  # messages read between the loop's other duties (~2 ms of decoding)


class Stream(StreamBase):
    """One streamed request as an iterator of Deltas (see StreamBase)."""

    _deltas: Iterator[Delta]

    def __iter__(self) -> Iterator[Delta]:
        return self._deltas

    def __next__(self) -> Delta:
        return next(self._deltas)

    def close(self) -> None:
        """Stop reading; cancels the request unless it has ended."""
        self._deltas.close()


class Client:
    """``with Client("tcp://127.0.0.1:5555") as c: c.complete("Hello", max_tokens=16)``."""

    def __init__(self, broker: str | None = None, *, model: str = "", timeout: float | None = None,
                 settings: Settings | dict | None = None):
        self._link = ClientLink(broker, model, timeout, settings, zmq.Context())
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        self._woken = False
        os.set_blocking(self._wake_w, False)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ovpool-client", daemon=True)
        self._thread.start()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancel what is still outstanding (its slots and queue places are freed at once), fail
        its futures and streams here, and release the socket."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake()
        self._thread.join()  # from here on this thread owns the socket
        self._run_commands(time.monotonic())  # those queued after the loop's last turn
        left = self._link.pending.close()
        self._send(left)
        self._link.socket.disable_monitor()
        self._link.monitor.close()
        # Long enough for the CANCELs to leave on a live connection, never long on a dead one.
        self._link.socket.close(linger=int(timing.HEARTBEAT_INTERVAL_S * 1000) if left else 0)
        self._link.context.term()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- API ------------------------------------------------------------------------------------

    def submit(self, prompt: str | list, *, model: str | None = None, timeout: float | None = None,
               params: SamplingParams | None = None, **sampling: Any) -> concurrent.futures.Future:
        """Send a request; the Future's result is a Completion (``future.request_id`` names it).
        Sampling: SamplingParams' fields as keywords, or ``params``, a SamplingParams built before."""
        msg = self._link.submit_msg(prompt, model, timeout, sampling, params=params)
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.request_id = msg.request_id
        self._start(msg, FutureSink(future))
        return future

    def complete(self, prompt: str, **kwargs: Any) -> Completion:
        return self._wait(self.submit(prompt, **kwargs), kwargs.get("timeout"))

    def chat(self, messages: list[dict[str, str]], **kwargs: Any) -> Completion:
        return self._wait(self.submit(messages, **kwargs), kwargs.get("timeout"))

    def _wait(self, future: concurrent.futures.Future, timeout: float | None) -> Completion:
        """``future``'s Completion, never waiting much past the request's timeout: its local deadline
        fails it at timeout + half a heartbeat, and this bound holds even if that cannot run."""
        limit = timeout if timeout is not None else self._link.timeout
        try:
            return future.result(limit + timing.HEARTBEAT_INTERVAL_S if limit else None)
        except concurrent.futures.TimeoutError:
            with contextlib.suppress(errors.OvpoolError):
                self.cancel(future)
            raise errors.RequestTimeoutError(
                f"request {future.request_id} got no answer within its timeout of {limit:g} s") from None

    def stream(self, prompt: str | list, *, model: str | None = None, timeout: float | None = None,
               params: SamplingParams | None = None, **sampling: Any) -> Stream:
        """Tokens as they arrive; leaving the loop early (or ``close()``) cancels the request;
        ``.completion`` is the finished Completion once the loop ended."""
        msg = self._link.submit_msg(prompt, model, timeout, sampling, STREAM_WINDOW, params)
        items: queue.SimpleQueue = queue.SimpleQueue()
        reader = StreamReader(msg.request_id, StreamSink(items.put), STREAM_WINDOW)
        self._start(msg, reader.sink)
        return Stream(reader, self._iterate(reader, items))

    def _iterate(self, reader: StreamReader, items: queue.SimpleQueue) -> Iterator[Delta]:
        try:
            while (delta := unwrap(items.get())) is not None:
                yield delta
                if (credit := reader.credit()) and not self._closed.is_set():
                    self._call(lambda now: credit)
        finally:
            if reader.left_early and not self._closed.is_set():
                self._call(lambda now: self._link.pending.abandon(reader.request_id))

    def cancel(self, request: str | concurrent.futures.Future) -> None:
        """Cancel a request; its Future then fails with ovpool.errors.CancelledError."""
        rid = getattr(request, "request_id", request)
        self._call(lambda now: [Cancel(rid)])

    def status(self, timeout: float = 10.0, ask_with: Message | None = None) -> dict:
        """The broker's STATUS (``ask_with``: another command it answers with one, e.g. DRAIN)."""
        future: concurrent.futures.Future = concurrent.futures.Future()

        def ask(now: float) -> list[Message]:
            ask = ask_with or Status()
            self._link.pending.add_status_waiter(FutureSink(future), now, ask)
            return [ask]

        self._call(ask)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            raise errors.BrokerUnavailableError(
                f"no status reply from {self._link.broker} in {timeout}s") from exc

    def drain(self, worker: str = "", timeout_s: float = 30.0, timeout: float = 10.0) -> dict:
        """Drain the pool (``worker`` "") or the workers ``worker`` names (protocol.Drain); the
        broker's status after it, whose ``draining`` says what drains."""
        return self.status(timeout, Drain(worker, timeout_s))

    def report_supervised(self, host: str, pid: int, workers: list[dict]) -> None:
        """Send ``ovpool serve``'s view of the workers on ``host`` (no reply; STATUS lists it)."""
        self._call(lambda now: [Supervised(host, pid, workers)])

    # -- I/O thread -----------------------------------------------------------------------------

    def _start(self, msg: Submit, sink: Any) -> None:
        self._call(lambda now: self._link.track(msg, sink, now))

    def _call(self, command: Callable[[float], list[Message]]) -> None:
        if self._closed.is_set():
            raise errors.BrokerUnavailableError("the client is closed")
        self._commands.put(command)
        self._wake()
        # Checked after queueing: a loop that stopped before this ran its last drain later, so
        # either that drain failed what the command added, or this raises (_loop).
        self._link.check_reading()

    @property
    def healthy(self) -> bool:
        """Whether this client can take requests: its I/O loop runs (False once closed)."""
        return self._reading()

    def link_state(self) -> LinkState:
        return self._link.state(self._reading())

    def _reading(self) -> bool:
        return self._thread.is_alive() and not self._closed.is_set()

    def _wake(self) -> None:
        # One byte per wake-up, not per command: the I/O thread clears the flag before it drains.
        if not self._woken:
            self._woken = True
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_w, b"!")

    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # a bug: whoever waits, or calls later, learns it at once
            self._link.loop_failed(exc)
            with contextlib.suppress(queue.Empty):
                while True:  # what was queued before _stopped was set: tracked, then failed
                    command = self._commands.get_nowait()
                    with contextlib.suppress(Exception):
                        command(time.monotonic())
            self._link.pending.fail_all(errors.BrokerUnavailableError(self._link.stopped))

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._link.socket, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        poller.register(self._link.monitor, zmq.POLLIN)
        next_tick = 0.0
        more = False  # messages were left unread: poll without waiting
        while True:
            ready = dict(poller.poll(0 if more else timing.POLL_INTERVAL_S * 1000))
            now = time.monotonic()
            if self._closed.is_set():
                return
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
                self._woken = False
                self._run_commands(now)
            more = self._link.socket in ready and self._receive(now)
            if self._link.monitor in ready:
                self._link.on_monitor(recv_monitor_message(self._link.monitor), now)
            if now >= next_tick:
                next_tick = now + timing.POLL_INTERVAL_S
                self._send(self._link.pending.tick(now))
                if self._link.pending.wants_failover(now):
                    self._fail_over(poller, now)

    def _fail_over(self, poller: zmq.Poller, now: float) -> None:
        poller.unregister(self._link.socket)
        poller.unregister(self._link.monitor)
        resend = self._link.switch(now)
        poller.register(self._link.socket, zmq.POLLIN)
        poller.register(self._link.monitor, zmq.POLLIN)
        self._send(resend)

    def _run_commands(self, now: float) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                self._send(self._commands.get_nowait()(now))

    def _receive(self, now: float) -> bool:
        """Handle up to _READ_BATCH messages; whether more may be waiting."""
        for _ in range(_READ_BATCH):
            try:
                frames = recv_frames(self._link.socket)
            except zmq.Again:
                return False
            self._send(self._link.on_frames(frames, now))
        return True

    def _send(self, msgs: list[Message]) -> None:
        for msg in msgs:
            if (frames := self._link.encoded(msg)) is not None:
                with contextlib.suppress(zmq.Again):
                    send_frames(self._link.socket, frames, zmq.NOBLOCK)
