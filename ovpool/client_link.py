"""ClientLink: what Client (threads) and AsyncClient (asyncio) each hold, composed: the DEALER, its
monitor, and one I/O loop's handling of each message, whichever loop runs it.

No message from the broker stops a client's loop: one that cannot be decoded or used fails only
the request it names and is counted (``LinkState.malformed``); a SUBMIT that cannot be encoded
fails alone, before the broker sees it, and is never resent. Should the loop stop anyway (a bug),
everything waiting fails at once with the reason, later calls raise it, and ``healthy`` is False.

``broker`` may list a standby pair's endpoints, comma-separated: the client talks to one at a time
and, when PendingRequests asks (a refusal, a lost or silent broker), moves to the next with a
fresh DEALER (``switch``) and sends it what is unfinished.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import zmq

from ovpool import endpoint, errors, timing
from ovpool.auth import HANDSHAKE_EVENTS, HandshakeWatch, secure_peer
from ovpool.config import ClientConfig
from ovpool.pending import PendingRequests
from ovpool.protocol import Message, Submit, decode, encode, request_id_of, send_frames
from ovpool.sampling_params import SamplingParams
from ovpool.settings import Settings
from ovpool.submit import make_submit

_log = logging.getLogger("ovpool.client")
# Socket-monitor events a client follows: the handshake's outcome, and TCP connects and drops.
LINK_EVENTS = HANDSHAKE_EVENTS | int(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)


def dealer(context: zmq.Context, broker: str, config: ClientConfig, events: int = 0) -> zmq.Socket:
    """A DEALER connected to ``broker``; with ``events``, its monitor socket (``get_monitor_socket``)
    is attached before it connects, since a monitor attached later misses what already happened
    (a loopback handshake can complete first: the client then never learned it was connected)."""
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    # No libzmq limits: what the broker sends is bounded by the credit this client granted, and a
    # DEALER at its high-water mark would block or refuse (a lost CANCEL or PING).
    sock.sndhwm = sock.rcvhwm = 0
    monitor = sock.get_monitor_socket(events) if events else None
    try:
        secure_peer(sock, config)
        sock.connect(broker)
    except BaseException as exc:
        if monitor is not None:
            sock.disable_monitor()
            monitor.close()
        sock.close()
        if isinstance(exc, zmq.ZMQError):
            raise endpoint.translate(exc, "connect to the broker at", broker) from exc
        raise
    return sock


@dataclass(frozen=True)
class LinkState:
    """A client's link to its broker, for a health check (``Client.link_state()``)."""

    reading: bool  # its I/O loop runs (Client: the thread; AsyncClient: its tasks): replies are read
    connected: bool  # a handshake with the broker completed and the connection has not dropped since
    heard_s: float | None  # seconds since the broker last sent this client anything; None: never
    malformed: int  # messages from the broker dropped as unreadable, or that failed their request
    stopped: str  # why the I/O loop stopped ("" while it runs or after a plain close)


class ClientLink:
    """A client's link to its broker: ``model`` and ``timeout`` are its requests' defaults; it owns
    ``context`` (terminated if the DEALER cannot be made), the DEALER and its monitor socket; its
    facade's loop closes them."""

    def __init__(self, broker: str | None, model: str, timeout: float | None,
                 settings: ClientConfig | Settings | dict | None, context: zmq.Context):
        self.config = ClientConfig.coerce(settings)  # the public facades' top: see ClientConfig.coerce
        self.brokers = endpoint.split(endpoint.check(broker or self.config.broker))
        self.broker = self.brokers[0]  # the one this client talks to now
        self.model = model
        self.timeout = timeout
        s = self.config
        self.pending = PendingRequests(time.monotonic(), broker=self.broker,
                                       connect_timeout_s=s.connect_timeout_s,
                                       curve=bool(s.curve_secret_key or s.curve_server_key),
                                       endpoints=len(self.brokers))
        self._handshake = HandshakeWatch(self.broker)
        self.stopped = ""  # why the I/O loop stopped by an error
        self.context = context
        try:
            self.socket = dealer(context, self.broker, self.config, LINK_EVENTS)
        except BaseException:
            context.term()
            raise
        self.monitor = self.socket.get_monitor_socket()  # the one attached before connecting

    def switch(self, now: float) -> list[Message]:
        """Move to the next endpoint of the pair: a new DEALER there; what to send it. A broker
        left while connected (it refused) is told to cancel what it may have taken meanwhile (it
        turned active mid-batch): else that request id stays its under this departed socket."""
        cancels = self.pending.cancels() if self.pending.connected else []
        raw = zmq.Socket.shadow(self.socket.underlying)  # a plain send, for AsyncClient's socket too
        for msg in cancels:
            with contextlib.suppress(zmq.ZMQError):
                send_frames(raw, encode(msg), zmq.NOBLOCK)
        self.socket.disable_monitor()
        self.monitor.close()
        self.socket.close(linger=int(timing.POLL_INTERVAL_S * 1000) if cancels else 0)
        old = self.broker
        self.broker = self.brokers[(self.brokers.index(old) + 1) % len(self.brokers)]
        self._handshake = HandshakeWatch(self.broker)
        self.socket = dealer(self.context, self.broker, self.config, LINK_EVENTS)
        self.monitor = self.socket.get_monitor_socket()
        resend = self.pending.switched(self.broker, now)
        _log.warning("failing over from the broker at %s to %s with %d unfinished request(s)", old,
                     self.broker, len(resend))
        return resend

    # -- health ---------------------------------------------------------------------------------

    def state(self, reading: bool) -> LinkState:
        """The link's state, for a facade whose I/O loop runs (``reading``) or not."""
        p = self.pending
        heard = None if p.heard_at is None else round(time.monotonic() - p.heard_at, 3)
        return LinkState(reading, p.connected, heard, p.malformed, self.stopped)

    def check_reading(self) -> None:
        if self.stopped:
            raise errors.BrokerUnavailableError(self.stopped)

    def loop_failed(self, exc: BaseException) -> None:
        """The I/O loop ended by an error: fail what waits (and from now on, every later call)."""
        self.stopped = (f"this client's I/O loop stopped ({type(exc).__name__}: {exc}); no reply can"
                         " arrive: close the client and create a new one")
        _log.error("%s", self.stopped)
        _log.debug("the client's I/O loop stopped", exc_info=exc)
        self.pending.fail_all(errors.BrokerUnavailableError(self.stopped))

    # -- one message each way -------------------------------------------------------------------

    def on_frames(self, frames: list[bytes], now: float) -> list[Message]:
        """One message from the broker; what to send back. No message, however malformed, raises."""
        try:
            msg = decode(frames)
        except errors.ProtocolError as exc:  # a newer broker's message, or a broken one
            return self.pending.malformed_reply(request_id_of(frames), "message", exc)
        return self.pending.on_message(msg, now)

    def encoded(self, msg: Message) -> list[bytes] | None:
        """``msg``'s frames; None if it cannot be encoded (a SUBMIT then fails alone, untracked)."""
        try:
            return encode(msg)
        except Exception as exc:  # msgpack raises several types: ints over 64 bits, lone surrogates
            self.pending.unsendable(msg, exc)
            return None

    def track(self, msg: Submit, sink: Any, now: float) -> list[Message]:
        """Wait for ``msg``'s answers; what to send for it: nothing once the broker refused this
        peer's handshake, which it does at connect time, usually before any request exists."""
        self.pending.add(msg, sink, now)
        if self._handshake.refused is not None:
            self.pending.fail_all(self._handshake.refused)
            return []
        return [msg]

    def on_monitor(self, event: dict, now: float) -> None:
        """A socket-monitor event: the connection's state, and a refused handshake, which fails
        the requests now (libzmq does not retry it) instead of after connect_timeout_s."""
        kind = event["event"]
        if kind == zmq.EVENT_CONNECTED:
            self.pending.link(False, now, tcp=True)
        elif kind == zmq.EVENT_DISCONNECTED:
            self.pending.link(False, now)
        else:
            self.pending.link(kind == zmq.EVENT_HANDSHAKE_SUCCEEDED, now)
            if self._handshake.on_event(event) is not None:
                self.pending.fail_all(self._handshake.refused)

    def submit_msg(self, prompt: str | list, model: str | None, timeout: float | None,
                    sampling: dict[str, Any], window: int = 0,
                    params: SamplingParams | None = None) -> Submit:
        self.check_reading()
        return make_submit(prompt, model if model is not None else self.model,
                           timeout if timeout is not None else self.timeout, sampling, window, params)
