"""The client side's bookkeeping, shared by Client and AsyncClient: no sockets, no threads.

It tracks SUBMITs (ovpool.submit builds them, with a seed fixed so that a resend after a broker
restart replays the same tokens), routes each reply to its request's sink (ovpool.sinks),
forwards every PARTIAL once (by ``seq``) and treats a jump in ``seq``, or a FINAL that counts
more PARTIALs than arrived, as StreamGapError (never as text: every stream ends with all its
tokens and FINAL, or with an error), resends what a restarted broker has forgotten (PING lists
outstanding ids, PONG names the unknown ones) and fails requests on their local deadline, when no
connection to the broker comes within connect_timeout_s (none at all, or a dropped one that does
not come back: a broker restarted within it gets them resent), when the broker says it shut down
(SHUTDOWN), or when a connected broker stays silent.

With the endpoints of a standby pair (``endpoints`` > 1) the last two cases, and a passive
broker's NotActiveError, are a failover instead (ovpool.failover): ``wants_failover`` says when,
the client moves to the next endpoint and ``switched`` gives every unfinished request to send there
(a stream's replay of what arrived is dropped by ``seq``, as after a restart). Only once no
endpoint has served for ``failover_budget_s`` do the requests fail.

Replies carry a worker's output unchanged, so none is trusted: one that cannot be read or used
fails only the request it names (MalformedMessageError, and a CANCEL to the broker) and is counted
in ``malformed``; a SUBMIT that cannot be encoded fails alone and is forgotten, never resent.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from ovpool import errors, timing
from ovpool.completion import Completion
from ovpool.connection import Connection
from ovpool.failover import Failover, is_refusal
from ovpool.protocol import (
    Cancel,
    Error,
    Final,
    Message,
    Partial,
    Ping,
    Pong,
    Shutdown,
    Status,
    StatusReply,
    Submit,
    delta_of,
)
from ovpool.sinks import Sink

_log = logging.getLogger("ovpool.client")


@dataclass
class _Pending:
    submit: Submit
    sink: Sink
    deadline: float
    next_seq: int = 0  # the seq of the next PARTIAL


class PendingRequests:
    """``broker``, ``connect_timeout_s``, ``curve``: the connection's (ovpool.connection);
    ``endpoints``: how many the client knows (ovpool.failover)."""

    def __init__(self, now: float, unavailable_s: float | None = None, *, broker: str = "",
                 connect_timeout_s: float = 2.0, curve: bool = False, endpoints: int = 1):
        self._unavailable_s = unavailable_s
        self._failover = Failover(endpoints, connect_timeout_s, now)
        self._conn = Connection(now, broker or "the configured endpoint", connect_timeout_s, curve)
        self._pending: dict[str, _Pending] = {}
        self._status_waiters: deque[tuple[Any, Message]] = deque()  # (waiter, what it asked)
        self._last_heard = now
        self._next_ping = now
        self._waiting_since = now  # since when something is outstanding
        self.heard_at: float | None = None  # when the broker last sent anything
        self.malformed = 0  # messages from the broker this client could not read or use

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def connected(self) -> bool:
        """A handshake with the broker completed and the connection has not dropped since."""
        return self._conn.up

    def link(self, up: bool, now: float, tcp: bool = False) -> None:
        """The socket monitor's news (ovpool.connection.Connection.link)."""
        self._conn.link(up, now, tcp)

    def add(self, submit: Submit, sink: Sink, now: float) -> None:
        self._start_waiting(now)
        # The broker answers timeouts itself (naming where the request was); the local deadline,
        # a moment later, covers a broker that cannot, and cancels the request there.
        grace = timing.HEARTBEAT_INTERVAL_S / 2
        deadline = now + submit.timeout_s + grace if submit.timeout_s > 0 else float("inf")
        self._pending[submit.request_id] = _Pending(submit, sink, deadline)

    def add_status_waiter(self, waiter: Any, now: float, ask: Message = Status()) -> None:
        """Wait for the STATUS_REPLY to ``ask`` (STATUS, DRAIN, MODEL_ORDER: each is answered with
        one, and each may be asked again of a pair's other broker)."""
        self._start_waiting(now)
        self._status_waiters.append((waiter, ask))

    def _start_waiting(self, now: float) -> None:
        if not self._pending and not self._status_waiters:
            self._last_heard = now  # the silence clocks run only while something is outstanding
            self._next_ping = now
            self._waiting_since = now

    def close(self, exc: errors.OvpoolError | None = None) -> list[Message]:
        """The client is closing (or gives up: ``exc``): fail every request here; the CANCELs that
        free their slots and queue places at the broker at once."""
        cancels: list[Message] = [Cancel(rid) for rid in self._pending]
        self.fail_all(exc or errors.BrokerUnavailableError("the client was closed"))
        return cancels

    def cancels(self) -> list[Message]:
        """A CANCEL for every outstanding request (for a broker this client leaves)."""
        return [Cancel(rid) for rid in self._pending]

    def abandon(self, request_id: str) -> list[Message]:
        """Its reader left a stream before the end: forget it; the CANCEL to send."""
        self._pending.pop(request_id, None)
        return [Cancel(request_id)]

    def on_message(self, msg: Message, now: float) -> list[Message]:
        """Deliver ``msg`` to its sink; returns messages to send back to the broker."""
        self._last_heard = self.heard_at = now
        if self._failover.pair:
            if is_refusal(msg):  # its peer serves: what it refused goes there
                return self._refusal(now)
            self._failover.served()
        handle = _HANDLERS.get(type(msg))
        try:
            return handle(self, msg) if handle is not None else []
        except Exception as exc:  # whatever is wrong with one reply, it fails its own request alone
            return self.malformed_reply(getattr(msg, "request_id", ""), type(msg).__name__.upper(), exc)

    def malformed_reply(self, request_id: str, what: str, exc: Exception) -> list[Message]:
        """A message this client cannot read or use (``what``: its command): counted, and the
        request it names (if any is outstanding) fails alone and is cancelled at the broker."""
        self.malformed += 1
        why = str(exc) if isinstance(exc, errors.OvpoolError) else f"{type(exc).__name__}: {exc}"
        if self.malformed & (self.malformed - 1) == 0:  # the 1st, 2nd, 4th, ...: a flood logs little
            _log.warning("dropped a malformed %s from the broker at %s (%s); %d so far",
                         what, self._conn.broker, why, self.malformed)
        p = self._pending.pop(request_id, None) if type(request_id) is str else None
        if p is None:
            return []
        p.sink.fail(errors.MalformedMessageError(
            f"request {request_id} got a malformed {what} from the broker at {self._conn.broker} ({why});"
            " is a worker of another ovpool version in the pool?"))
        return [Cancel(request_id)]

    def unsendable(self, msg: Message, exc: Exception) -> None:
        """``msg`` could not be encoded: a SUBMIT fails alone and is forgotten (never resent)."""
        p = self._pending.pop(msg.request_id, None) if isinstance(msg, Submit) else None
        if p is None:  # this client's own message: nothing waits on it but the log
            _log.error("could not encode a %s for the broker: %r", type(msg).__name__, exc)
            return
        p.sink.fail(errors.InvalidRequestError(
            f"request {msg.request_id} cannot be encoded for the broker ({exc}); check its prompt"
            " and parameters"))

    def _on_partial(self, msg: Partial) -> list[Message]:
        p = self._pending.get(msg.request_id)
        if p is None or msg.seq < p.next_seq:
            return []  # a request that ended, or a replay after a resend
        if msg.seq > p.next_seq:
            return self._gap(p, f"PARTIAL {msg.seq} came after {p.next_seq - 1}")
        if p.sink.streams:
            delta = delta_of(msg)
            p.next_seq += 1
            p.sink.delta(delta)
        else:
            p.next_seq += 1
        return []

    def _on_final(self, msg: Final) -> list[Message]:
        p = self._pending.get(msg.request_id)
        if p is None:
            return []
        if p.submit.window and msg.partials != p.next_seq:
            return self._gap(p, f"FINAL after {p.next_seq} of its {msg.partials} PARTIALs")
        completion = Completion.from_dict(msg.completion, "FINAL.completion")
        del self._pending[msg.request_id]
        p.sink.done(completion)
        return []

    def _on_pong(self, msg: Pong) -> list[Message]:
        return [self._resend(self._pending[r]) for r in msg.unknown if type(r) is str and r in self._pending]

    def _on_status_reply(self, msg: StatusReply) -> list[Message]:
        if self._status_waiters:
            self._status_waiters.popleft()[0].done(msg.status)
        return []

    def _on_shutdown(self, msg: Shutdown) -> list[Message]:
        self.fail_all(errors.BrokerUnavailableError(
            f"the broker at {self._conn.broker} shut down before answering"
            f"{f' ({msg.reason})' if msg.reason else ''}; start it again and resend"))
        return []

    def _gap(self, p: _Pending, what: str) -> list[Message]:
        """A lost message: fail the request (its stream must not read on as if nothing was missing)."""
        rid = p.submit.request_id
        del self._pending[rid]
        p.sink.fail(errors.StreamGapError(f"request {rid} lost tokens on the way: {what}"))
        return [Cancel(rid)]

    @staticmethod
    def _resend(p: _Pending) -> Submit:
        """The SUBMIT again, for a broker that forgot it. Its replay of the PARTIALs already here is
        dropped unread, so it gets credit for them on top of the window."""
        if not p.submit.window:
            return p.submit
        return dataclasses.replace(p.submit, window=p.submit.window + p.next_seq)

    def _on_error(self, msg: Error) -> list[Message]:
        exc = errors.from_wire(msg.code, msg.message)
        p = self._pending.pop(msg.request_id, None)
        if p is not None:
            p.sink.fail(exc)
        elif not msg.request_id and self._status_waiters:
            self._status_waiters.popleft()[0].fail(exc)
        return []

    def tick(self, now: float) -> list[Message]:
        """Local deadlines, the connection, broker silence, and the periodic PING while anything is
        outstanding."""
        if not self._pending and not self._status_waiters:
            if self._conn.lost(now):
                self._failover.idle_lost()  # idle (serve's reports), but what it sends next needs a broker
            return []
        unavailable_s = self._failover.silence_s(self._unavailable_s or timing.CLIENT_UNAVAILABLE_S)
        if self._conn.lost(now, since=self._waiting_since):
            if not self._failover.lost(now):
                self.fail_all(self._conn.unreachable())
            return []
        # Silence counts once a handshake completed: before that, connect_timeout_s decides (a CURVE
        # broker's refusal can take seconds beside busy processes, and is not silence).
        if self._conn.up and now - self._last_heard >= unavailable_s:
            if not self._failover.lost(now):
                self.fail_all(errors.BrokerLostError(
                    f"the broker at {self._conn.broker} is connected but has not answered for"
                    f" {unavailable_s:.1f} s: its process is stopped (SIGSTOP, a debugger) or hung;"
                    " check it and its log, restart it and resend"))
            return []
        out: list[Message] = []
        for rid in [r for r, p in self._pending.items() if now >= p.deadline]:
            self._pending.pop(rid).sink.fail(errors.RequestTimeoutError(
                f"request {rid} reached its timeout without an answer from the broker"))
            out.append(Cancel(rid))
        if self._pending and now >= self._next_ping:
            self._next_ping = now + timing.HEARTBEAT_INTERVAL_S
            out.append(Ping(list(self._pending)))
        return out

    @property
    def failover_budget_s(self) -> float:
        return self._failover.budget_s

    def _refusal(self, now: float) -> list[Message]:
        """A passive broker refused: fail over, unless no endpoint has served for the budget."""
        if not self._failover.refused(now):
            self.fail_all(errors.NotActiveError(
                f"no broker of the standby pair took the request in {self.failover_budget_s:.1f} s"
                f" (the last, {self._conn.broker}, is passive): is its peer running?"))
        return []

    def wants_failover(self, now: float) -> bool:
        return self._failover.wants(now)

    def switched(self, broker: str, now: float) -> list[Message]:
        """The client now talks to ``broker``: every unfinished request and status ask to send
        there (each is answered once: the one left behind is no longer read)."""
        self._conn.moved(broker, now)
        self._failover.switched(now)
        self._last_heard = self._next_ping = now
        return [*(self._resend(p) for p in self._pending.values()), *(ask for _, ask in self._status_waiters)]

    def fail_all(self, exc: errors.OvpoolError) -> None:
        """Fail every pending request and status call with ``exc`` (the client is closing or refused)."""
        pending, self._pending = self._pending, {}
        for p in pending.values():
            p.sink.fail(exc)
        while self._status_waiters:
            self._status_waiters.popleft()[0].fail(exc)


# What each reply does; anything else a broker sends (a client's own commands) is ignored.
_HANDLERS = {Partial: PendingRequests._on_partial, Final: PendingRequests._on_final,
             Error: PendingRequests._on_error, Pong: PendingRequests._on_pong,
             StatusReply: PendingRequests._on_status_reply, Shutdown: PendingRequests._on_shutdown}
