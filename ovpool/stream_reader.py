"""A streamed request as its reader sees it, whichever client reads it: the queue its deltas
arrive in, the credit its reader returns, and what the caller holds. No sockets, no waiting: the
clients' shells (ovpool.client: a thread; ovpool.async_client: a coroutine) wait and send.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ovpool import errors
from ovpool.completion import Completion, Delta
from ovpool.protocol import Credit, Message

END = object()  # a stream's end marker
# Tokens of credit a stream starts with; its reader returns half of it at a time. 256 tokens are
# seconds of a real model's output and ~10 ms of a null worker's, so a reader that keeps up never
# waits for credit, and one that stops holds at most this much in the sockets.
STREAM_WINDOW = 256


class StreamSink:
    """Puts deltas, then END or the error, into a queue (queue.SimpleQueue or asyncio.Queue);
    keeps the FINAL's Completion (finish reason, usage) as ``completion``."""

    streams = True

    def __init__(self, put: Callable[[Any], None]):
        self.delta, self._put = put, put
        self.ended = False  # set on the I/O side; a reader leaving early cancels unless ended
        self.completion: Completion | None = None

    def done(self, completion: Completion) -> None:
        self.ended = True
        self.completion = completion
        self._put(END)

    def fail(self, exc: errors.OvpoolError) -> None:
        self.ended = True
        self._put(exc)


def credits(window: int) -> Iterator[int]:
    """After each token a stream's reader takes: the credit to return then (0: none yet)."""
    half, taken = max(1, window // 2), 0
    while True:
        taken += 1
        if taken == half:
            taken = 0
            yield half
        else:
            yield 0


def unwrap(item: Any) -> Delta | None:
    """A stream queue's item as the next Delta, None at the end; raises the request's error."""
    if isinstance(item, Exception):
        raise item
    return None if item is END else item


class StreamReader:
    """One stream's reader: the CREDIT due after each delta it takes, and whether it left before
    the end (its request is then cancelled)."""

    def __init__(self, request_id: str, sink: StreamSink, window: int):
        self.request_id, self.sink = request_id, sink
        self._grants = credits(window)

    def credit(self) -> list[Message]:
        """What to send once the reader has taken a delta: a CREDIT when one is due, unless the
        stream has ended."""
        tokens = next(self._grants)
        return [Credit(self.request_id, tokens)] if tokens and not self.sink.ended else []

    @property
    def left_early(self) -> bool:
        return not self.sink.ended


class StreamBase:
    """One streamed request, as Stream (an iterator) and AsyncStream (an async one) hand out its
    Deltas: it also keeps the FINAL's Completion (finish reason, usage, the context-limit note),
    which a streaming caller needs after the last token."""

    def __init__(self, reader: StreamReader, deltas: Any):
        self.request_id = reader.request_id
        self._sink, self._deltas = reader.sink, deltas

    @property
    def completion(self) -> Completion | None:
        """The finished Completion once the stream has ended normally, else None."""
        return self._sink.completion
