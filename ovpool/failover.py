"""A client's failover between the endpoints of a standby pair, as pure logic (time passed in).

With more than one endpoint, a lost broker (no connection within connect_timeout_s, or a connected
one silent too long) and a passive broker's refusal (NotActiveError, or a STATUS that is not the
active one's) move the client to the next endpoint instead of failing its requests, until no
endpoint has served for the budget. The client asks ``wants`` each turn and, on moving, says
``switched``; ovpool.pending.PendingRequests owns one and fails the requests when it gives up.
"""

from __future__ import annotations

from ovpool import errors, timing
from ovpool.protocol import Error, Message, StatusReply


class Failover:
    """``endpoints``: how many the client knows (one: never a failover); ``connect_timeout_s``:
    how long each endpoint may take to connect (setting connect_timeout_s)."""

    def __init__(self, endpoints: int, connect_timeout_s: float, now: float):
        self.endpoints = endpoints
        self._connect_timeout_s = connect_timeout_s
        self._due = False
        self._failing_since: float | None = None  # since when no endpoint of the pair served
        self._switched_at = now

    @property
    def pair(self) -> bool:
        return self.endpoints > 1

    @property
    def budget_s(self) -> float:
        """How long a pair may go without serving before requests fail: each endpoint's connect
        timeout, and the expiry a passive broker waits out before a client's vote counts."""
        return (self._connect_timeout_s + timing.HEARTBEAT_EXPIRY_S) * (self.endpoints + 1)

    def silence_s(self, unavailable_s: float) -> float:
        """How long a connected broker may stay silent: a stopped broker of a pair has a peer that
        takes over within expiries, so waiting longer only delays the move."""
        return min(unavailable_s, timing.HEARTBEAT_EXPIRY_S * 3) if self.pair else unavailable_s

    def served(self) -> None:
        """A broker answered as the active one."""
        self._failing_since = None

    def idle_lost(self) -> None:
        """The connection is lost with nothing outstanding: what the client sends next needs a
        broker, so move on (no budget runs while nothing waits)."""
        if self.pair:
            self._due = True

    def lost(self, now: float) -> bool:
        """The broker is lost: whether to move to the next endpoint (False: none, or out of time)."""
        if not self.pair:
            return False
        if self._failing_since is None:
            self._failing_since = now
        self._due = now - self._failing_since < self.budget_s
        return self._due

    def refused(self, now: float) -> bool:
        """A passive broker refused: whether to move on (False: no endpoint served for the budget)."""
        if self._failing_since is None:
            self._failing_since = now
        if now - self._failing_since >= self.budget_s:
            return False
        self._due = True
        return True

    def wants(self, now: float) -> bool:
        """Whether to move to the next endpoint now; refusals move at most twice an interval, so
        two refusing brokers (a backup that never saw its primary) are not asked in a tight loop."""
        return self._due and now - self._switched_at >= timing.HEARTBEAT_INTERVAL_S / 2

    def switched(self, now: float) -> None:
        """The client moved to the next endpoint."""
        self._due, self._switched_at = False, now
        if self._failing_since is None:
            self._failing_since = now


def is_refusal(msg: Message) -> bool:
    """A passive standby broker's answer: NotActiveError, or a STATUS that is not the active one's."""
    if type(msg) is Error:
        return msg.code == errors.NotActiveError.code
    standby = msg.status.get("standby") if type(msg) is StatusReply and type(msg.status) is dict else None
    return type(standby) is dict and standby.get("state") != "active"
