"""Who of a broker pair serves: the zguide's Binary Star state machine, pure (time passed in).

Two brokers, a primary and a backup, tell each other their state every heartbeat interval on a
socket of their own. Exactly one is *active* (takes clients and workers); the other is *passive*
and refuses them, so they try the other endpoint. The rules that keep a split brain out:

- the primary starts first: a backup alone never takes clients until it has seen the primary
  (in any state: one killed within an interval of its start is still failed over);
- a passive broker becomes active only when it has lost its peer (no state message for
  ``expiry_s``) AND a client asks it to serve (the "client vote"): a cut between the brokers
  alone, with clients still served by the other side, never makes a second active;
- two actives meeting (a paused primary resumed after its backup took over) resolve to the
  backup, the one the clients voted for; the primary yields and goes passive;
- a broker that was itself frozen (SIGSTOP, a stalled VM) for ``expiry_s - interval_s`` or more
  cannot know whether its peer took over meanwhile (its last state message may be that old when
  the freeze began): an active one goes passive, and any waits a fresh expiry before a client's
  vote counts. What waited in its peer socket through the freeze is stale: for ``interval_s``
  after waking, a peer message can keep it passive but never make it active.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class State(enum.IntEnum):
    """Own state, and the state carried on the peer socket (its wire value)."""
    PRIMARY = 1   # starting as primary, peer not seen yet
    BACKUP = 2    # starting as backup, peer not seen yet
    ACTIVE = 3
    PASSIVE = 4


class Action(enum.Enum):
    SERVE = "serve"      # take this client's request
    REFUSE = "refuse"    # tell the client to try the other endpoint
    ACTIVATED = "activated"
    DEACTIVATED = "deactivated"  # drop what this broker holds: the peer serves its clients now


@dataclass
class BinaryStar:
    """``BinaryStar(primary=True, now=t, expiry_s=3.0)``; feed it ``peer``, ``client``, ``tick``."""
    primary: bool
    now: float
    expiry_s: float
    interval_s: float = 1.0

    def __post_init__(self) -> None:
        self.state = State.PRIMARY if self.primary else State.BACKUP
        # A fresh broker waits one expiry before the primary may take clients on its own.
        self.peer_expiry = self.now + self.expiry_s
        self.next_send = self.now
        self.last_seen = self.now
        self.hold_until = self.now  # woken from a freeze: peer messages until then may be stale
        self.seen_peer = False
        self.stalls = 0  # freezes woken from (a stalled loop counts: an overloaded host)
        self.last_stall_s = 0.0

    @property
    def active(self) -> bool:
        return self.state is State.ACTIVE

    def peer(self, peer_state: State, now: float) -> list[Action]:
        """A state message from the peer."""
        woke = self._woke(now)
        self.peer_expiry, self.seen_peer = now + self.expiry_s, True
        s = self.state
        if peer_state is State.ACTIVE:
            if s is State.ACTIVE and not self.primary:
                return woke  # the clients voted for us while the primary was away: it yields
            return woke + self._become(State.PASSIVE)
        if now < self.hold_until:
            return woke
        if peer_state is State.BACKUP and s in (State.PRIMARY, State.PASSIVE):
            return woke + self._become(State.ACTIVE)  # the backup (re)starts: we serve
        two_passive = peer_state is State.PASSIVE and self.primary
        if s is State.PASSIVE and (peer_state is State.PRIMARY or two_passive):
            # The primary restarts: we serve, it goes passive; two passives: the primary serves. A
            # restarting primary that hears a passive peer waits: that peer takes over on hearing it.
            return woke + self._become(State.ACTIVE)
        return woke

    def client(self, now: float) -> list[Action]:
        """A client request arrived: serve it, or refuse it (and maybe take over: the vote)."""
        woke = self._woke(now)
        s = self.state
        if s is State.ACTIVE:
            return [Action.SERVE]
        may_vote = s in (State.PRIMARY, State.PASSIVE) or (s is State.BACKUP and self.seen_peer)
        if may_vote and now >= self.peer_expiry:
            return [*self._become(State.ACTIVE), Action.SERVE]
        return [*woke, Action.REFUSE]

    def tick(self, now: float) -> tuple[list[Action], bool]:
        """What the passing of time changed, and whether our state is due to the peer now."""
        woke = self._woke(now)
        if now < self.next_send:
            return woke, False
        self.next_send = now + self.interval_s
        return woke, True

    def woken(self, now: float) -> list[Action]:
        """A freeze since the last call, checked alone: a broker stopped in the middle of reading
        its socket goes on with a time taken before the freeze."""
        return self._woke(now)

    def _woke(self, now: float) -> list[Action]:
        """After a freeze past the expiry: its peer may have taken over meanwhile."""
        gap, self.last_seen = now - self.last_seen, max(self.last_seen, now)
        if gap < self.expiry_s - self.interval_s:
            return []
        self.stalls, self.last_stall_s = self.stalls + 1, gap
        self.peer_expiry = now + self.expiry_s  # a fresh wait before any vote counts again
        self.hold_until = now + self.interval_s
        return self._become(State.PASSIVE) if self.active else []

    def _become(self, state: State) -> list[Action]:
        was_active, self.state = self.active, state
        if self.active and not was_active:
            return [Action.ACTIVATED]
        if was_active and not self.active:
            return [Action.DEACTIVATED]
        return []
