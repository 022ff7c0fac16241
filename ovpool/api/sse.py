"""Server-sent events: OpenAI frames them as ``data: <json>`` and a blank line per event, the
stream closed by ``data: [DONE]``, a failure after the first token an ``{"error": ...}`` event;
the Responses and Anthropic APIs name each event (``event: <type>`` before its data). ``Body``
writes a stream with its dialect's Writer."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ovpool import errors
from ovpool.api import errors as api_errors
from ovpool.completion import Completion, Delta

if TYPE_CHECKING:
    from ovpool.api.dialect import Writer
    from ovpool.api.metrics import ApiMetrics
    from ovpool.api.streams import Merged

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering (nginx)

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def data(obj: Any) -> bytes:
    return b"data: " + _dumps(obj).encode() + b"\n\n"


def event(name: str, obj: Any) -> bytes:
    """A named event: ``event: <name>``, then its data."""
    return b"event: " + name.encode() + b"\n" + data(obj)


def error(exc: errors.OvpoolError) -> bytes:
    return data(api_errors.body(exc))


class Body:
    """A streamed response's bytes: its writer's opening, an event per Delta and per choice's
    Completion, its closing; a failure becomes the writer's failure event, and ``status`` its HTTP
    status (for the metrics). Times the tokens for the metrics as they pass."""

    def __init__(self, writer: Writer, first: tuple[int, Any], events: Merged, metrics: ApiMetrics,
                 endpoint: str, started: float):
        self.writer, self._first, self._events, self._metrics = writer, first, events, metrics
        self.status = 200
        self._endpoint = endpoint
        self._started = started
        self._last: dict[int, float] = {}  # choice index -> when its previous token came

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            yield self.writer.opening() + self._event(*self._first)
            async for index, item in self._events:
                yield self._event(index, item)
            tail = self.writer.closing()
        except errors.OvpoolError as exc:
            self.status = api_errors.classify(exc)[0]
            tail = self.writer.failure(exc)
        finally:
            await self._events.aclose()
        self._metrics.counted(self._endpoint, self.writer.usage())
        yield tail

    def _event(self, index: int, item: Delta | Completion | errors.OvpoolError) -> bytes:
        if isinstance(item, Delta):
            now = time.perf_counter()
            previous = self._last.get(index)
            if previous is None:
                self._metrics.first_token(self._endpoint, now - self._started)
            else:
                self._metrics.next_token(self._endpoint, now - previous)
            self._last[index] = now
            return self.writer.delta(index, item)
        if isinstance(item, Completion):
            return self.writer.done(index, item)
        raise item
