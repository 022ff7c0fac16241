"""A broker a test plays by hand: one ROUTER socket on a loopback port that takes what clients send
and answers with whatever frames the test chooses, well-formed or not."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import msgpack
import zmq

from ovpool.async_client import AsyncClient
from ovpool.client import Client
from ovpool.completion import Completion, Usage
from ovpool.protocol import VERSION, Final, Message, Submit, decode, encode

WAIT_MS = 10_000  # a bound for a message that is already on its way, not a timing assumption


def completion(text: str = "ok") -> dict:
    """A FINAL's well-formed ``completion``."""
    return Completion(text, [1, 2], "stop", Usage(1, 2), {"total_s": 0.1}).to_dict()


def raw(command: int, body: object) -> list[bytes]:
    """The frames of a message with any command byte and any msgpack body."""
    return [VERSION, bytes([command]), msgpack.packb(body, use_bin_type=True)]


class FakeBroker:
    def __init__(self):
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.linger = 0
        self.endpoint = f"tcp://127.0.0.1:{self._socket.bind_to_random_port('tcp://127.0.0.1')}"
        self.peer = b""  # the identity of the client whose message came last
        self.received: list[Message] = []  # everything the clients sent, in order

    def close(self) -> None:
        self._socket.close()
        self._context.term()

    def __enter__(self) -> FakeBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, request_id: str) -> Submit:
        """The SUBMIT of ``request_id``, skipping whatever else comes first (PINGs, CREDITs, other
        requests, resends); AssertionError if none comes."""
        while True:
            msg = self.receive()
            if isinstance(msg, Submit) and msg.request_id == request_id:
                return msg

    def receive(self, wait_ms: int = WAIT_MS) -> Message:
        assert self._socket.poll(wait_ms), "the client sent nothing"
        self.peer, *frames = self._socket.recv_multipart()
        self.received.append(decode(frames))
        return self.received[-1]

    def submitted(self) -> list[str]:
        """The ids of every SUBMIT the clients sent so far (resends included), in order."""
        while self._socket.poll(0):
            self.receive(0)
        return [m.request_id for m in self.received if isinstance(m, Submit)]

    def send(self, msg: Message | list[bytes], peer: bytes | None = None) -> None:
        """``msg`` (a Message, or frames from ``raw``) to ``peer``, by default the last one heard."""
        frames = msg if isinstance(msg, list) else encode(msg)
        self._socket.send_multipart([peer or self.peer, *frames])

    def answer(self, request_id: str, text: str = "ok") -> None:
        """Wait for ``request_id``'s SUBMIT and answer it with a FINAL."""
        self.submit(request_id)
        self.send(Final(request_id, completion(text)))


class SyncDriver:
    """A Client, with a stream read to its end on another thread (this one plays the broker)."""

    def __init__(self, endpoint: str, **options: object):
        self.client = Client(endpoint, **options)
        self._readers = concurrent.futures.ThreadPoolExecutor(4)

    def close(self) -> None:
        self.client.close()
        self._readers.shutdown()

    def submit(self, prompt: str, **sampling: object) -> concurrent.futures.Future:
        return self.client.submit(prompt, **sampling)

    def stream(self, prompt: str, **sampling: object) -> concurrent.futures.Future:
        """A future of the stream's Deltas, or of its error."""
        stream = self.client.stream(prompt, **sampling)
        future = self._readers.submit(list, stream)
        future.request_id = stream.request_id
        return future


class AsyncDriver:
    """An AsyncClient on an event loop of its own thread, called like SyncDriver."""

    def __init__(self, endpoint: str, **options: object):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

        async def open_client() -> AsyncClient:  # made on its loop's thread, as an app would
            return await AsyncClient(endpoint, **options).__aenter__()
        self.client = self._run(open_client())

    def close(self) -> None:
        self._run(self.client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(WAIT_MS / 1000)

    def submit(self, prompt: str, **sampling: object) -> concurrent.futures.Future:
        async def start() -> asyncio.Future:
            return self.client.submit(prompt, **sampling)
        return self._outcome(self._run(start()))

    def stream(self, prompt: str, **sampling: object) -> concurrent.futures.Future:
        async def start() -> Any:
            return self.client.stream(prompt, **sampling)

        async def read(stream: Any) -> list:
            return [d async for d in stream]
        stream = self._run(start())
        future = asyncio.run_coroutine_threadsafe(read(stream), self._loop)
        future.request_id = stream.request_id
        return future

    def _outcome(self, inner: asyncio.Future) -> concurrent.futures.Future:
        async def wait() -> Any:
            return await inner
        future = asyncio.run_coroutine_threadsafe(wait(), self._loop)
        future.request_id = inner.request_id
        return future


DRIVERS = {"Client": SyncDriver, "AsyncClient": AsyncDriver}
