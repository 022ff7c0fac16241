"""Where one request's results go: the Sink that ovpool.pending delivers to, and FutureSink, which
completes a future (a stream's sink is ovpool.stream_reader.StreamSink)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Protocol

from ovpool import errors
from ovpool.completion import Completion, Delta


class Sink(Protocol):
    """Where one request's results go (a future, a stream queue); ``delta`` only if ``streams``."""

    streams: bool

    def delta(self, delta: Delta) -> None: ...

    def done(self, completion: Completion) -> None: ...

    def fail(self, exc: errors.OvpoolError) -> None: ...


# A future its caller cancelled (from another thread, for concurrent.futures) takes no result.
_SETTLED = (concurrent.futures.InvalidStateError, asyncio.InvalidStateError)


class FutureSink:
    """Completes a concurrent.futures.Future or an asyncio.Future (called on its owner's thread)."""

    streams = False  # deltas are not wanted: only the Completion

    def __init__(self, future: Any):
        self.future = future

    def done(self, result: Any) -> None:
        if not self.future.done():
            try:  # not contextlib.suppress, whose object costs more than the rest, once a request
                self.future.set_result(result)
            except _SETTLED:
                pass

    def fail(self, exc: errors.OvpoolError) -> None:
        if not self.future.done():
            try:
                self.future.set_exception(exc)
            except _SETTLED:
                pass
