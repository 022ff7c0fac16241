"""The sockets of a standby broker pair around the pure Binary Star state machine.

Each broker of the pair binds a PUB socket (``bind``) on which it publishes its state every
heartbeat interval (protocol.PeerState), and subscribes to its peer's (``peer``), as the zguide's
bstar does. What the broker loop asks: ``turn(now)`` each loop turn (the timer, its own state
out, the peer's latest state in), ``vote(now)`` for a client's SUBMIT or PING (serve it, or refuse
it and maybe take over), ``active`` for everything else. The actions that change who serves
(ACTIVATED, DEACTIVATED) go back to the broker, which owns the router.

Under CURVE the link holds the broker's key pair (auth.ServerSecurity.secure_pair): a process
without the secret can neither read our states nor get one of its own to the FSM, wherever it
binds. A failed handshake or an oversized frame makes libzmq drop that connection for good, with
no reconnect, so a link silent for an expiry dials its peer again: whoever held the peer's
endpoint for a while (or one bad frame) costs the pair an expiry, never its hearing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import zmq

from ovpool import endpoint, timing
from ovpool.auth import ServerSecurity
from ovpool.broker.binary_star import Action, BinaryStar, State
from ovpool.errors import ConfigError, ProtocolError
from ovpool.protocol import PeerState, decode, encode, recv_frames, send_frames

log = logging.getLogger(__name__)

ROLES = ("primary", "backup")
# Without CURVE whoever holds the peer's state endpoint can send anything: one turn reads a bounded
# number of messages, so a flood delays the peer's state a few turns but never holds the loop.
_STATES_PER_TURN = 64
# A state is a few dozen bytes; a frame past this ends the connection (redialled on silence).
_MAX_FRAME_BYTES = 64 * 1024


@dataclass(frozen=True)
class Standby:
    """``role`` primary or backup; ``bind``: where this broker publishes its state; ``peer``: the
    peer's state endpoint."""

    role: str
    bind: str
    peer: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"standby role {self.role!r} is not one of {', '.join(ROLES)}")
        endpoint.check(self.bind, "standby state bind address", many=False)
        endpoint.check(self.peer, "standby peer state endpoint", many=False)


class StandbyLink:
    """``with StandbyLink(context, standby, clients_endpoint, now) as link: link.turn(now)``."""

    def __init__(self, context: zmq.Context, security: ServerSecurity, standby: Standby, served: str,
                 now: float):
        self.standby, self.served = standby, served
        self.star = BinaryStar(primary=standby.role == "primary", now=now,
                               expiry_s=timing.HEARTBEAT_EXPIRY_S, interval_s=timing.HEARTBEAT_INTERVAL_S)
        self.peer_state: State | None = None
        self.peer_served = ""  # the endpoint the peer's clients use, from its PeerState
        self._context, self._security = context, security
        self._heard = self._dialed = self._woke = now  # the last peer state, (re)connect, freeze's end
        self._stalls_seen = 0
        self._pub: zmq.Socket | None = None
        self._sub: zmq.Socket | None = None

    def __enter__(self) -> StandbyLink:
        try:
            self._pub = self._context.socket(zmq.PUB)
            self._sub = self._context.socket(zmq.SUB)
            for sock in (self._pub, self._sub):  # the PUB reads its subscribers' subscriptions
                sock.linger = 0
                sock.maxmsgsize = _MAX_FRAME_BYTES
            self._sub.setsockopt(zmq.SUBSCRIBE, b"")
            self._security.secure_pair(self._pub, self._sub)
            self._pub.bind(self.standby.bind)
            self._sub.connect(self.standby.peer)
        except zmq.ZMQError as exc:
            self.__exit__()
            raise endpoint.translate(exc, "bind the standby state socket to", self.standby.bind) from exc
        log.info("standby broker (%s): state on %s, peer's on %s", self.standby.role, self.standby.bind,
                 self.standby.peer)
        return self

    def __exit__(self, *exc: object) -> None:
        for sock in (self._pub, self._sub):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._sub = None

    @property
    def active(self) -> bool:
        return self.star.active

    def turn(self, now: float) -> list[Action]:
        """The timer, our state to the peer when due, and the peer's latest state."""
        actions, due = self.star.tick(now)
        self._woken(now)
        if due:
            send_frames(self._pub, encode(PeerState(int(self.star.state), self.served)), zmq.NOBLOCK)
        latest = self._latest()
        if latest is not None:
            self._heard = now
            self.peer_state, self.peer_served = State(latest.state), latest.endpoint
            actions += self.star.peer(self.peer_state, now)
        elif now - max(self._heard, self._dialed, self._woke) >= self.star.expiry_s:
            self._redial(now)
        return self._logged(actions)

    def vote(self, now: float) -> list[Action]:
        actions = self.star.client(now)
        self._woken(now)
        return self._logged(actions)

    def check(self, now: float) -> list[Action]:
        """A freeze since the last turn, before a message is routed (binary_star.woken)."""
        actions = self.star.woken(now)
        self._woken(now)
        return self._logged(actions)

    def describe(self) -> dict:
        """STATUS's ``standby``: who this broker is in the pair, and what it last heard."""
        peer = self.peer_state.name.lower() if self.peer_state is not None else None
        return {"role": self.standby.role, "state": self.star.state.name.lower(), "endpoint": self.served,
                "peer": self.standby.peer, "peer_state": peer, "peer_endpoint": self.peer_served,
                "stalls": self.star.stalls}

    def _latest(self) -> PeerState | None:
        """The newest state waiting (older ones are stale: only the last counts)."""
        latest = None
        for _ in range(_STATES_PER_TURN):
            try:
                frames = recv_frames(self._sub)
            except zmq.Again:
                return latest
            try:
                msg = decode(frames)
            except ProtocolError as exc:
                log.warning("dropped a malformed peer state: %s", exc)
                continue
            if isinstance(msg, PeerState) and msg.state in State._value2member_map_:
                latest = msg
        return latest

    def _woken(self, now: float) -> None:
        """After a freeze the link's silence was ours, not the peer's: what waited in the socket
        meanwhile is read, not dropped by a redial, and the link gets an expiry as after a dial."""
        if self.star.stalls != self._stalls_seen:
            self._stalls_seen, self._woke = self.star.stalls, now
            log.warning("standby broker (%s): this process did not run for %.1f s (SIGSTOP, a stalled VM, "
                        "an overloaded host); its peer may have taken over meanwhile", self.standby.role,
                        self.star.last_stall_s)

    def _redial(self, now: float) -> None:
        """Connect to the peer afresh: libzmq never retries a connection it dropped for a failed
        handshake or an oversized frame, and a dead peer's would retry anyway."""
        if self._dialed <= self._heard:  # the first redial since the peer was last heard
            log.warning("standby broker (%s): no state from the peer at %s for %.1f s; reconnecting (under"
                        " CURVE the peer must hold this broker's key pair)", self.standby.role,
                        self.standby.peer, now - self._heard)
        self._sub.disconnect(self.standby.peer)
        self._sub.connect(self.standby.peer)
        self._dialed = now

    def _logged(self, actions: list[Action]) -> list[Action]:
        if Action.ACTIVATED in actions or Action.DEACTIVATED in actions:
            peer = self.peer_state.name.lower() if self.peer_state else "unseen"
            log.warning("standby broker (%s) is now %s (peer: %s)", self.standby.role,
                        self.star.state.name.lower(), peer)
        return actions
