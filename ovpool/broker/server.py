"""The broker process: one ROUTER socket and one poll loop around the pure Router.

The hot path decodes, checks the sender's role (broker/roles.py: under CURVE a client key cannot
act as a worker, nor a worker key submit), routes and encodes; it never logs per message. Timers
run at least every POLL_INTERVAL_S. The loop stops when ``stop`` is set (SIGTERM/SIGINT in the
CLI) and, on the way out, tells the workers to register again with whichever broker comes next.

One of a standby pair (``standby``, broker/standby.py) serves only while its Binary Star state is
active: passive, it answers STATUS and refuses the rest with NotActiveError, so clients and
workers go to its peer. Going passive, it tells whoever it holds to go there too and forgets them;
going active, it starts from a fresh router (whose grace lets the workers register again first).
"""

from __future__ import annotations

import logging
import threading
import time

import zmq

from ovpool import endpoint, timing
from ovpool.auth import ServerSecurity
from ovpool.broker import roles
from ovpool.broker.binary_star import Action
from ovpool.broker.metrics import BrokerMetrics, BrokerObserver
from ovpool.broker.metrics_http import MetricsServer
from ovpool.broker.router import Output, Router
from ovpool.broker.standby import Standby, StandbyLink
from ovpool.config import BrokerConfig
from ovpool.errors import AuthenticationError, NotActiveError, ProtocolError
from ovpool.protocol import (
    MAX_MESSAGE_BYTES,
    Cancel,
    Credit,
    Error,
    Message,
    Ping,
    Status,
    StatusReply,
    Submit,
    Supervised,
    decode,
    encode,
    recv_frames,
    send_frames,
)

log = logging.getLogger(__name__)

_DRAIN = 512               # messages handled between timer checks
_OUTBOX = 64               # messages sent together at most: a long drain's first replies wait no longer
_NOBLOCK = int(zmq.NOBLOCK)
_VOTES = (Submit, Ping)  # what counts as a client's vote for a passive broker to take over
_UNANSWERED = (Cancel, Credit, Supervised)  # dropped by a passive broker: nothing here to act on


class Broker:
    """``with Broker("tcp://127.0.0.1:5555") as b: b.serve(stop_event)``."""

    def __init__(self, bind: str, config: BrokerConfig = BrokerConfig(), standby: Standby | None = None):
        self.bind = endpoint.check(bind, "broker bind address", many=False)
        self.config = s = config
        self.endpoint = bind
        self._context = zmq.Context()
        self._security = ServerSecurity(self._context, config)
        self._socket: zmq.Socket | None = None
        self._refusals_logged: set[tuple[int, type]] = set()
        # What the last drain sent, sent together before the next poll: libzmq's I/O thread is
        # woken about once per batch instead of once per message (docs/performance.md, HTTP API overhead).
        self._outbox: list[list[bytes]] = []
        self.router = self._new_router(time.monotonic())
        self._standby = (StandbyLink(self._context, self._security, standby, bind, time.monotonic())
                         if standby else None)
        # Off unless a port is set: observing every message costs ~15% of the routing rate.
        self.metrics = BrokerObserver(BrokerMetrics()) if s.metrics_port else None
        self._metrics_server = (MetricsServer(self.metrics.metrics.registry, s.metrics_port)
                                if self.metrics else None)

    def __enter__(self) -> Broker:
        try:
            self._security.__enter__()
            sock = self._context.socket(zmq.ROUTER)
            self._socket = sock
            sock.linger = 0
            # What an honest peer is sent is bounded by the credit it granted (docs/protocol.md,
            # flow control), far below this mark; a peer that grants credit and never reads meets
            # it, and a ROUTER at its high-water mark drops that peer's messages, not the broker.
            # 2**17 messages: ~512 streams at a client's 256-token window.
            sock.rcvhwm = 0
            sock.sndhwm = 1 << 17
            # Up to twice the limit is read and answered with an error; beyond, libzmq drops the peer.
            sock.maxmsgsize = 2 * MAX_MESSAGE_BYTES
            self._security.apply(sock, self.bind)
            sock.bind(self.bind)
            if self._standby is not None:
                self._standby.__enter__()
            if self._metrics_server is not None:
                self._metrics_server.__enter__()
        except zmq.ZMQError as exc:
            self.__exit__(None, None, None)
            raise endpoint.translate(exc, "bind the broker to", self.bind) from exc
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.endpoint = sock.last_endpoint.decode()
        if self._standby is not None:
            self._standby.served = self.endpoint
        log.info("broker listening on %s (queue_limit=%d; %s)", self.endpoint, self.config.queue_limit,
                 self._security.mode())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._metrics_server is not None:
            self._metrics_server.__exit__()
        if self._standby is not None:
            self._standby.__exit__()
        if self._socket is not None:
            # One of a pair hands over instead: its clients and workers move to the peer.
            self._send(self._handover(f"the broker at {self.endpoint} of a standby pair stopped: send to its"
                                      " peer") if self._standby else self.router.shutdown(time.monotonic()))
            self._flush()
            self._socket.close(linger=int(timing.POLL_INTERVAL_S * 1000))  # let DISCONNECT/SHUTDOWN out
            self._socket = None
        self._security.__exit__()
        self._context.term()

    def serve(self, stop: threading.Event) -> None:
        sock = self._socket
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        next_tick = 0.0
        caught_up = True  # the last drain emptied the socket
        receive = _receive_open if self._security.roles is None else self._receive_keyed
        while not stop.is_set():
            now = time.monotonic()
            self._standby_turn(now)
            if now >= next_tick:
                self._send(self.router.tick(now, caught_up))
                if self.metrics:
                    self._observe()
                next_tick = now + timing.POLL_INTERVAL_S
            self._flush()
            if not poller.poll(max(0.0, next_tick - now) * 1000):
                caught_up = True
                continue
            now = time.monotonic()
            self._standby_turn(now)  # a broker woken from a freeze learns it before routing
            caught_up = False
            for _ in range(_DRAIN):
                try:
                    frames, held = receive(sock)
                except zmq.Again:
                    caught_up = True
                    break
                if len(frames) >= 2:
                    self._route(frames, held, now)

    def _receive_keyed(self, sock: zmq.Socket) -> tuple[list[bytes], int]:
        """A message and the roles of its sender's key: the ZAP User-Id, read per message (a
        routing id is no identity: a departed peer's may be reused by another key)."""
        first = sock.recv(_NOBLOCK, copy=False)
        frames = [first.bytes, *recv_frames(sock)] if first.more else [first.bytes]
        try:
            return frames, self._security.roles.get(first.get("User-Id"), 0)
        except zmq.ZMQError:  # no ZAP identity (cannot happen on a CURVE socket): no role
            return frames, 0

    def _observe(self) -> None:
        workers = self.router.workers.values()
        # Serve may still call a worker "starting" for a moment after it registered: count it once.
        registered = {(w.info.host, w.info.pid) for w in workers}
        self.metrics.tick(self.router.queues, [(len(w.inflight), w.info.slots) for w in workers],
                          [e for e in self.router.supervised.entries()
                           if (e.get("host"), e.get("pid")) not in registered])
        c = self.router.counters
        self.metrics.metrics.set_prefix(
            [(w.info.worker_id, w.prefixes.prompt_tokens, w.prefixes.cached_prompt_tokens) for w in workers],
            c.prefix_hits, c.prefix_misses)

    def _route(self, frames: list[bytes], held: int, now: float) -> None:
        peer = frames[0]
        try:
            msg = decode(frames[1:])
        except ProtocolError as exc:
            self._send(self.router.malformed(peer, exc))
            return
        if held != roles.ANY and not roles.allows(held, type(msg)):
            self._send(self._refuse(peer, held, msg))
            return
        if len(frames[-1]) > MAX_MESSAGE_BYTES:
            log.warning("refused a %s of %d bytes (limit %d)", type(msg).__name__, len(frames[-1]),
                        MAX_MESSAGE_BYTES)
            self._send(self.router.oversized(peer, msg, len(frames[-1])))
            return
        if self._standby is not None and not self._admits(peer, msg, now):
            return
        out = self._handle(peer, msg, now)
        if len(out) == 1 and out[0][1] is msg:  # forwarded as it came (PARTIAL, FINAL): no re-encode
            self._send_raw(out[0][0], frames[1:], msg)
        else:
            self._send(out)

    def _refuse(self, peer: bytes, held: int, msg: Message) -> Output:
        """A command this peer's key may not send: never routed, answered with an ERROR naming
        why, logged once per kind of key and command (a bounded set)."""
        why = roles.refusal(held, type(msg))
        if (held, type(msg)) not in self._refusals_logged:
            self._refusals_logged.add((held, type(msg)))
            log.warning("refused a %s from peer %s: %s", type(msg).__name__, peer.hex(), why)
        return [(peer, Error(getattr(msg, "request_id", ""), AuthenticationError.code, why))]

    def _handle(self, peer: bytes, msg: Message, now: float) -> Output:
        try:
            if self.metrics:
                self.metrics.incoming(msg, now)
            out = self.router.handle(peer, msg, now)
            if self._standby is not None:  # STATUS (and DRAIN's reply) say who serves
                out = [(p, StatusReply({**m.status, "standby": self._standby.describe()}))
                       if isinstance(m, StatusReply) else (p, m) for p, m in out]
            return out
        except Exception:  # a routing (or metrics) bug must cost one message, never the broker
            log.exception("broker failed to route a %s", type(msg).__name__)
            return []

    def _new_router(self, now: float) -> Router:
        s = self.config
        return Router(now=now, queue_limit=s.queue_limit, max_new_tokens=s.max_new_tokens,
                      stream_stall_s=s.stream_stall_s, progress_timeout_s=s.progress_timeout_s,
                      prefix_routing=s.routing == "prefix")

    def _standby_turn(self, now: float) -> None:
        if self._standby is not None:
            self._follow(self._standby.turn(now), now)

    def _follow(self, actions: list[Action], now: float) -> None:
        """A change of who serves: hand over what this router holds, and start a fresh one."""
        if Action.DEACTIVATED in actions:
            self._send(self._handover(self._not_active()))
        if Action.DEACTIVATED in actions or Action.ACTIVATED in actions:
            self.router = self._new_router(now)

    def _handover(self, why: str) -> Output:
        """Going passive, or stopping: every request held fails over (its client sends it to the
        peer), every worker registers with the peer."""
        code = NotActiveError.code
        out: Output = [(j.client, Error(rid, code, why)) for rid, j in self.router.jobs.items()]
        out.extend((w.identity, Error("", code, why)) for w in self.router.workers.values())
        return out

    def _admits(self, peer: bytes, msg: Message, now: float) -> bool:
        """Whether a standby broker routes ``msg``: while active, yes; passive, only STATUS. A
        client's SUBMIT or PING is its vote (bstar's client request): it may make us active."""
        fresh = time.monotonic()  # stopped mid-drain (SIGSTOP), the drain's ``now`` predates it
        self._follow(self._standby.check(fresh), fresh)
        if isinstance(msg, _VOTES):
            self._follow(self._standby.vote(now), now)
        if self._standby.active or isinstance(msg, Status):
            return True
        if not isinstance(msg, _UNANSWERED):
            rid = getattr(msg, "request_id", "")
            self._send([(peer, Error(rid, NotActiveError.code, self._not_active()))])
        return False

    def _not_active(self) -> str:
        d = self._standby.describe()
        return (f"the broker at {self.endpoint} is the passive one of a standby pair (its peer, "
                f"{d['peer_endpoint'] or d['peer']}, is {d['peer_state'] or 'not heard yet'}): "
                "send to the other endpoint")

    def _send(self, out: Output) -> None:
        for peer, msg in out:
            self._send_raw(peer, encode(msg), msg)

    def _send_raw(self, peer: bytes, frames: list[bytes], msg: Message) -> None:
        if self.metrics:
            self.metrics.outgoing(msg, time.monotonic())
        self._outbox.append([peer, *frames])
        if len(self._outbox) >= _OUTBOX:
            self._flush()

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        for frames in outbox:
            try:  # a ROUTER never blocks; with no high-water mark it drops only for a peer that is gone
                send_frames(self._socket, frames)
            except zmq.ZMQError:
                pass  # a vanished peer: its requests end by its silence (Router), nobody is waiting


def _receive_open(sock: zmq.Socket) -> tuple[list[bytes], int]:
    """Without CURVE every peer holds every role."""
    return recv_frames(sock), roles.ANY
