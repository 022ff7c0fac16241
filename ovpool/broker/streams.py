"""The broker's half of stream flow control: credit per stream, and the tokens that wait for it.

A streaming SUBMIT (``window`` > 0) opens a stream with that many tokens of credit. Each PARTIAL
forwarded spends one; each CREDIT from the client returns what its reader consumed. A PARTIAL that
finds no credit waits here, in order, and the stream's FINAL or ERROR waits behind the last of
them. So the broker's send queue to a client never holds more than the credit that client granted
plus one end per stream: libzmq never reaches a high-water mark and nothing is dropped.

A reader cannot have consumed more than it was sent, so a stream's credit never exceeds its
window (a CREDIT for more is cut to it), and the Router opens no window wider than the request's
max_tokens: a client that grants itself 10**9 tokens gets what an honest one gets.

What waits here is bounded by design: at most max_tokens of one stream (the broker's
max_new_tokens), and a stream whose reader takes nothing for ``stall_s`` while tokens wait is
ended with ClientTooSlowError (by Router, which also stops its worker). A slow reader costs only
its own streams: the worker keeps generating at its own pace and the other streams keep flowing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ovpool.broker.state import Output
from ovpool.protocol import Error, Final, Partial

_NEVER = float("inf")


@dataclass
class Stream:
    client: bytes
    credit: int
    window: int  # the most credit it may hold (an honest reader's credit never exceeds its window)
    held: deque[Partial] = field(default_factory=deque)
    end: Final | Error | None = None  # the last message, once the worker sent it
    waiting_since: float = _NEVER  # when a token first found no credit (reset as credit comes)


class Streams:
    def __init__(self, stall_s: float):
        self.stall_s = stall_s
        self._streams: dict[str, Stream] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._streams

    def __len__(self) -> int:
        return len(self._streams)

    def client(self, request_id: str) -> bytes | None:
        s = self._streams.get(request_id)
        return None if s is None else s.client

    def open(self, request_id: str, client: bytes, window: int) -> None:
        self._streams[request_id] = Stream(client, window, window)

    def partial(self, msg: Partial, now: float, out: Output) -> None:
        """Forward ``msg`` now if its stream has credit, else keep it for when credit comes."""
        s = self._streams[msg.request_id]
        if s.credit > 0 and not s.held:
            s.credit -= 1
            out.append((s.client, msg))
            return
        if not s.held:
            s.waiting_since = now
        s.held.append(msg)

    def end(self, msg: Final | Error, out: Output) -> None:
        """The stream's last message: sent after every token that waits, then the stream is gone."""
        s = self._streams[msg.request_id]
        if s.held:
            s.end = msg
            return
        del self._streams[msg.request_id]
        out.append((s.client, msg))

    def credit(self, peer: bytes, request_id: str, tokens: int, now: float, out: Output) -> None:
        s = self._streams.get(request_id)
        if s is None or s.client != peer or tokens <= 0:
            return  # a stream that ended meanwhile, or credit from someone else's client
        s.credit = min(s.credit + tokens, s.window)
        while s.credit > 0 and s.held:
            s.credit -= 1
            out.append((s.client, s.held.popleft()))
        if s.held:
            s.waiting_since = now
            return
        s.waiting_since = _NEVER
        if s.end is not None:
            del self._streams[request_id]
            out.append((s.client, s.end))

    def drop(self, request_id: str) -> int:
        """Forget a stream (it failed: the caller sends its ERROR); the tokens it held."""
        s = self._streams.pop(request_id, None)
        return 0 if s is None else len(s.held)

    def stalled(self, now: float) -> list[str]:
        """Streams whose reader has taken nothing for ``stall_s`` while tokens wait for it."""
        limit = now - self.stall_s
        return [rid for rid, s in self._streams.items() if s.waiting_since <= limit]

    def held(self) -> int:
        """Tokens waiting for credit, in all streams (STATUS)."""
        return sum(len(s.held) for s in self._streams.values())
