"""What Client (threads) and AsyncClient (asyncio) share: the DEALER, its monitor, and one I/O loop's
handling of each message, whichever loop runs it.

No message from the broker stops a client's loop: one that cannot be decoded or used fails only
the request it names and is counted (``LinkState.malformed``); a SUBMIT that cannot be encoded
fails alone, before the broker sees it, and is never resent. Should the loop stop anyway (a bug),
everything waiting fails at once with the reason, later calls raise it, and ``healthy`` is False.

``broker`` may list a standby pair's endpoints, comma-separated: the client talks to one at a time
and, when PendingRequests asks (a refusal, a lost or silent broker), moves to the next with a
fresh DEALER (``_switch``) and sends it what is unfinished.
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


class ClientBase:
    def __init__(self, broker: str | None, model: str, timeout: float | None,
                 settings: ClientConfig | Settings | dict | None):
        self.config = ClientConfig.coerce(settings)  # the public facades' top: see ClientConfig.coerce
        self.brokers = endpoint.split(endpoint.check(broker or self.config.broker))
        self.broker = self.brokers[0]  # the one this client talks to now
        self.model = model
        self.timeout = timeout
        s = self.config
        self._pending = PendingRequests(time.monotonic(), broker=self.broker,
                                        connect_timeout_s=s.connect_timeout_s,
                                        curve=bool(s.curve_secret_key or s.curve_server_key),
                                        endpoints=len(self.brokers))
        self._handshake = HandshakeWatch(self.broker)
        self._stopped = ""  # why the I/O loop stopped by an error

    def _open(self, context: zmq.Context) -> None:
        """The context, the DEALER connected to the broker and its monitor socket."""
        self._context = context
        try:
            self._socket = dealer(context, self.broker, self.config, LINK_EVENTS)
        except BaseException:
            context.term()
            raise
        self._monitor = self._socket.get_monitor_socket()  # the one attached before connecting

    def _switch(self, now: float) -> list[Message]:
        """Move to the next endpoint of the pair: a new DEALER there; what to send it. A broker
        left while connected (it refused) is told to cancel what it may have taken meanwhile (it
        turned active mid-batch): else that request id stays its under this departed socket."""
        cancels = self._pending.cancels() if self._pending.connected else []
        raw = zmq.Socket.shadow(self._socket.underlying)  # a plain send, for AsyncClient's socket too
        for msg in cancels:
            with contextlib.suppress(zmq.ZMQError):
                send_frames(raw, encode(msg), zmq.NOBLOCK)
        self._socket.disable_monitor()
        self._monitor.close()
        self._socket.close(linger=int(timing.POLL_INTERVAL_S * 1000) if cancels else 0)
        old = self.broker
        self.broker = self.brokers[(self.brokers.index(old) + 1) % len(self.brokers)]
        self._handshake = HandshakeWatch(self.broker)
        self._socket = dealer(self._context, self.broker, self.config, LINK_EVENTS)
        self._monitor = self._socket.get_monitor_socket()
        resend = self._pending.switched(self.broker, now)
        _log.warning("failing over from the broker at %s to %s with %d unfinished request(s)", old,
                     self.broker, len(resend))
        return resend

    # -- health ---------------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """Whether this client can take requests: its I/O loop runs (False once closed)."""
        return self._reading()

    def link_state(self) -> LinkState:
        p = self._pending
        heard = None if p.heard_at is None else round(time.monotonic() - p.heard_at, 3)
        return LinkState(self._reading(), p.connected, heard, p.malformed, self._stopped)

    def _reading(self) -> bool:
        raise NotImplementedError

    def _check_reading(self) -> None:
        if self._stopped:
            raise errors.BrokerUnavailableError(self._stopped)

    def _loop_failed(self, exc: BaseException) -> None:
        """The I/O loop ended by an error: fail what waits (and from now on, every later call)."""
        self._stopped = (f"this client's I/O loop stopped ({type(exc).__name__}: {exc}); no reply can"
                         " arrive: close the client and create a new one")
        _log.error("%s", self._stopped)
        _log.debug("the client's I/O loop stopped", exc_info=exc)
        self._pending.fail_all(errors.BrokerUnavailableError(self._stopped))

    # -- one message each way -------------------------------------------------------------------

    def _on_frames(self, frames: list[bytes], now: float) -> list[Message]:
        """One message from the broker; what to send back. No message, however malformed, raises."""
        try:
            msg = decode(frames)
        except errors.ProtocolError as exc:  # a newer broker's message, or a broken one
            return self._pending.malformed_reply(request_id_of(frames), "message", exc)
        return self._pending.on_message(msg, now)

    def _encoded(self, msg: Message) -> list[bytes] | None:
        """``msg``'s frames; None if it cannot be encoded (a SUBMIT then fails alone, untracked)."""
        try:
            return encode(msg)
        except Exception as exc:  # msgpack raises several types: ints over 64 bits, lone surrogates
            self._pending.unsendable(msg, exc)
            return None

    def _track(self, msg: Submit, sink: Any, now: float) -> list[Message]:
        """Wait for ``msg``'s answers; what to send for it: nothing once the broker refused this
        peer's handshake, which it does at connect time, usually before any request exists."""
        self._pending.add(msg, sink, now)
        if self._handshake.refused is not None:
            self._pending.fail_all(self._handshake.refused)
            return []
        return [msg]

    def _on_monitor(self, event: dict, now: float) -> None:
        """A socket-monitor event: the connection's state, and a refused handshake, which fails
        the requests now (libzmq does not retry it) instead of after connect_timeout_s."""
        kind = event["event"]
        if kind == zmq.EVENT_CONNECTED:
            self._pending.link(False, now, tcp=True)
        elif kind == zmq.EVENT_DISCONNECTED:
            self._pending.link(False, now)
        else:
            self._pending.link(kind == zmq.EVENT_HANDSHAKE_SUCCEEDED, now)
            if self._handshake.on_event(event) is not None:
                self._pending.fail_all(self._handshake.refused)

    def _submit_msg(self, prompt: str | list, model: str | None, timeout: float | None,
                    sampling: dict[str, Any], window: int = 0,
                    params: SamplingParams | None = None) -> Submit:
        self._check_reading()
        return make_submit(prompt, model if model is not None else self.model,
                           timeout if timeout is not None else self.timeout, sampling, window, params)
