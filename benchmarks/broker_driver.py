"""A lean load generator for the broker: one thread, one raw DEALER socket, no client library.

Like wrk against an HTTP server, it spends as little CPU per request as it can, so the broker
and the workers get the machine. Every message still goes through ``ovpool.protocol``'s own
encode/decode: the driver speaks the real wire format, not a hand-built copy of it.
"""

from __future__ import annotations

import time

import zmq

from ovpool.client import dealer
from ovpool.errors import BrokerUnavailableError
from ovpool.protocol import (
    Credit,
    Final,
    Partial,
    Submit,
    decode,
    encode,
    message_type,
    recv_frames,
    send_frames,
)
from ovpool.settings import Settings
from ovpool.stream_reader import STREAM_WINDOW
from ovpool.submit import make_submit

_STALL_S = 10.0  # no reply for this long means the pool is stuck: fail instead of hanging


class LeanDriver:
    """``with LeanDriver(endpoint, max_tokens) as d: d.throughput(20000, 512); d.latencies(2000)``."""

    def __init__(self, endpoint: str, max_tokens: int):
        self._context = zmq.Context()
        self._socket = dealer(self._context, endpoint, Settings.coerce(None))
        # One validated SUBMIT (seeded like the client's) whose fields every request shares.
        self._template = make_submit("x", "", None, {"max_tokens": max_tokens})
        self._sent = 0

    def __enter__(self) -> LeanDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self._socket.close(linger=0)
        self._context.term()

    def throughput(self, total: int, window: int) -> float:
        """Requests/s with up to ``window`` SUBMITs in flight."""
        sent = done = 0
        start = time.perf_counter()
        while done < total:
            while sent < total and sent - done < window:
                self._submit()
                sent += 1
            done += self._finished()
        return total / (time.perf_counter() - start)

    def latencies(self, samples: int) -> list[float]:
        """Round-trip seconds of ``samples`` requests sent one at a time."""
        out = []
        for _ in range(samples):
            t = time.perf_counter()
            self._submit()
            while not self._finished():
                pass
            out.append(time.perf_counter() - t)
        return out

    def stream(self, streams: int, tokens: int) -> float:
        """Tokens/s streamed to this one reader: ``streams`` at once of ``tokens`` each, each with
        the client libraries' window, credit returned as the reader takes tokens (as Client does)."""
        half = STREAM_WINDOW // 2
        taken: dict[str, int] = {}
        start = time.perf_counter()
        for i in range(streams):
            self._sent += 1
            rid = f"s{self._sent}"
            t = self._template
            params = {**t.params, "max_tokens": tokens, "seed": i}
            send_frames(self._socket, encode(Submit(rid, t.model, params, f"p{i}", window=STREAM_WINDOW)))
            taken[rid] = 0
        received = 0
        while taken:
            if not self._socket.poll(_STALL_S * 1000):
                raise BrokerUnavailableError(f"no reply from the broker for {_STALL_S}s")
            while True:
                try:
                    msg = decode(recv_frames(self._socket))
                except zmq.Again:
                    break
                if isinstance(msg, Partial):
                    received += 1
                    taken[msg.request_id] += 1
                    if taken[msg.request_id] % half == 0:
                        send_frames(self._socket, encode(Credit(msg.request_id, half)))
                elif isinstance(msg, Final):
                    del taken[msg.request_id]
                else:
                    raise RuntimeError(f"unexpected reply: {msg}")
        return received / (time.perf_counter() - start)

    def _submit(self) -> None:
        self._sent += 1
        t = self._template
        send_frames(self._socket, encode(Submit(f"b{self._sent}", t.model, t.params, t.prompt)))

    def _finished(self) -> int:
        """FINALs among the messages waiting now (blocking until at least one message arrives)."""
        if not self._socket.poll(_STALL_S * 1000):
            raise BrokerUnavailableError(f"no reply from the broker for {_STALL_S}s")
        finals = 0
        while True:
            try:
                frames = recv_frames(self._socket)
            except zmq.Again:
                return finals
            kind = message_type(frames)  # a PARTIAL's body is never unpacked: nothing here reads it
            if kind is Final:
                finals += 1
            elif kind is not Partial:
                raise RuntimeError(f"unexpected reply: {decode(frames)}")
