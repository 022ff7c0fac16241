"""Single streams as requests of one Batcher: the engine's generations on the paged graph.

``Streams.open(admitted)`` schedules a request on the Batcher and returns its ``Stream``, which
behaves as a Generation (``step()``, iteration, ``completion()``, ``close()``): a step that finds
none of its events waiting runs the Batcher's next pass, which moves every open stream on, and
each stream takes its own events. One KV block pool, one prefix cache (the Batcher's) for all.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator

from ovpool.completion import Completion, Delta
from ovpool.errors import InvalidRequestError
from ovpool.worker.events import Event, Failed, Finished, Token
from ovpool.worker.generate.batcher import Batcher
from ovpool.worker.generate.generation import Generation
from ovpool.worker.generate.intake import Admitted


class Streams:
    """The open streams of one Batcher and the events its passes produced for them."""

    def __init__(self, batcher: Batcher):
        self.batcher = batcher
        self._events: dict[str, deque[Event]] = {}
        self._ids = itertools.count()

    def open(self, admitted: Admitted) -> Stream:
        request_id = f"stream-{next(self._ids)}"
        generation = self.batcher.add_admitted(request_id, admitted)
        self._events[request_id] = deque()
        return Stream(self, request_id, generation)

    def next_event(self, request_id: str) -> Event:
        """The stream's next event, running passes until there is one."""
        queue = self._events[request_id]
        while not queue:
            for event in self.batcher.step():
                if event.request_id in self._events:  # else a stream closed before its end
                    self._events[event.request_id].append(event)
        return queue.popleft()

    def peek(self, request_id: str) -> Event | None:
        queue = self._events.get(request_id)
        return queue[0] if queue else None

    def close(self, request_id: str) -> None:
        if self._events.pop(request_id, None) is not None:
            self.batcher.cancel(request_id)


class Stream:
    """One request of ``streams``, driven as a Generation is."""

    def __init__(self, streams: Streams, request_id: str, generation: Generation):
        self._streams, self.request_id, self._generation = streams, request_id, generation
        self.prompt_ids, self.params = generation.prompt_ids, generation.params
        self._completion: Completion | None = None
        self._closed = False

    @property
    def finished(self) -> bool:
        return self._completion is not None

    @property
    def cached(self) -> int:
        """Prompt tokens whose KV came from the prefix cache (known once a pass ran it)."""
        return self._generation.cached

    def step(self) -> Delta | None:
        """Up to one pass of the Batcher: this stream's next Delta with text, or None."""
        if self.finished or self._closed:
            return None
        event = self._streams.next_event(self.request_id)
        if isinstance(event, Token) and isinstance(self._streams.peek(self.request_id), Finished):
            event, delta = self._streams.next_event(self.request_id), event.delta  # its last
        else:
            delta = event.delta if isinstance(event, Token) else None
        if isinstance(event, Failed):
            self.close()
            raise event.error
        if isinstance(event, Finished):
            self._completion = event.completion
            self.close()
        return delta

    def __iter__(self) -> Iterator[Delta]:
        while not self.finished and not self._closed:
            delta = self.step()
            if delta is not None:
                yield delta

    def completion(self) -> Completion:
        if self._completion is None:
            raise InvalidRequestError("the generation has not finished: call step() until finished")
        return self._completion

    def close(self) -> None:
        """Cancel the request if it runs (idempotent)."""
        if not self._closed:
            self._closed = True
            self._streams.close(self.request_id)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
