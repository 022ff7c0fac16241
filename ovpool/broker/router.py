"""The broker's routing core: decoded messages in, (peer, message) pairs out. No sockets, no clock.

The Router builds its state (broker/router_state.py: one RouterState, and the Endings its handlers
share) and dispatches; what it does with each message lives with its sender (broker/client_messages.py,
broker/worker_messages.py) and what it does as time passes in broker/timers.py, each given that
state, their handlers put into one dispatch table at construction.

Every method takes ``now`` (monotonic seconds) so tests drive time by hand. On top of the
placement rules (its Placement, the only code that changes queues and slots), the Router guarantees:

- each PARTIAL reaches the client once and in order (a replay after a re-dispatch repeats the same
  seeded tokens, and those already forwarded, by ``seq``, are dropped); a stream gets no more than
  its credit, the rest waits in its Streams (broker/streams.py), and FINAL/ERROR are never dropped;
- a request id belongs to the client that sent it: another client's SUBMIT with it is refused;
- no peer's message grows its state past broker/bounds.py's limits: a READY, LOAD_FAILED or
  SUPERVISED over them is dropped (counted ``malformed``), a PARTIAL past its request's
  max_tokens too (no honest worker sends one), and a LOAD_FAILED is forgotten after a while;
- a worker's replies return it credit (protocol.WORKER_WINDOW) as they are handled;
- a request that gets no token for ``progress_timeout_s`` goes to another worker (Placement.stall),
  and that worker draws no new request until it replies again (Placement.replied);
- the broker frees a slot as soon as it sends CANCEL (the worker handles messages in order, so the
  cancel lands before the next request);
- a request that names no model goes to the only model served; a restarted broker queues requests
  for models not seen yet for BROKER_GRACE_S, so workers can register again first, and those of
  a model a supervisor loads on demand (SUPERVISED entries naming it) until their deadlines;
- a DRAIN of the pool refuses new SUBMITs and fails what is unfinished at its deadline, a DRAIN of
  workers takes them out of placement (broker/drain.py); either is answered with STATUS_REPLY.
"""

from __future__ import annotations

from ovpool import errors, timing
from ovpool.broker import drain
from ovpool.broker.client_messages import ClientMessages
from ovpool.broker.router_state import Endings, RouterState
from ovpool.broker.state import Output
from ovpool.broker.timers import Timers
from ovpool.broker.worker_messages import WorkerMessages
from ovpool.protocol import (
    MAX_MESSAGE_BYTES,
    WORKER_WINDOW,
    Credit,
    Disconnect,
    Error,
    Final,
    Heartbeat,
    Message,
    Partial,
    Shutdown,
)

MAX_ATTEMPTS = 3
_MAX_STRANGERS = 10_000
_REPLIES = (Partial, Final, Error)
_FROM_WORKERS = (Heartbeat, *_REPLIES)  # what only a registered worker sends
# Credit goes back to a worker in quarters of its window: one CREDIT per ~1,000 replies, and the
# worker never waits for one unless the broker is that far behind.
_ACK_EVERY = WORKER_WINDOW // 4


class Router:
    """``counters``, ``placement``, ``streams``, ``supervised``, ``failures`` and Placement's
    ``workers``, ``jobs`` and ``queues`` are the state's own objects, for the server and tests to read."""

    def __init__(self, *, now: float, queue_limit: int = 256, max_new_tokens: int = 4096,
                 max_attempts: int = MAX_ATTEMPTS, stream_stall_s: float = 30.0,
                 progress_timeout_s: float = 60.0, prefix_routing: bool = True):
        self._state = state = RouterState(
            now=now, queue_limit=queue_limit, max_new_tokens=max_new_tokens, max_attempts=max_attempts,
            stream_stall_s=stream_stall_s, progress_timeout_s=progress_timeout_s,
            prefix_routing=prefix_routing)
        self._endings = endings = Endings(state)
        self.counters, self.placement, self.streams = state.counters, state.placement, state.streams
        self.workers, self.jobs, self.queues = state.workers, state.jobs, state.queues
        self.supervised, self.failures = state.supervised, state.failures
        self._clients_heard = state.clients_heard
        self._timers = Timers(state, endings)
        self._handlers = {**ClientMessages(state, endings).handlers(),
                          **WorkerMessages(state, endings).handlers()}

    @property
    def drain(self) -> drain.PoolDrain | None:
        """The pool's drain, once a DRAIN started one."""
        return self._state.drain

    # -- inputs ---------------------------------------------------------------------------------

    def handle(self, peer: bytes, msg: Message, now: float) -> Output:
        out: Output = []
        worker = self.workers.get(peer)
        if worker is not None:
            worker.expires = now + timing.HEARTBEAT_EXPIRY_S
            if isinstance(msg, _REPLIES):
                worker.unacked += 1
                if worker.unacked >= _ACK_EVERY:
                    out.append((peer, Credit("", worker.unacked)))
                    worker.unacked = 0
        elif isinstance(msg, _FROM_WORKERS):
            return self._stranger(peer)
        else:
            self._clients_heard[peer] = now
        handler = self._handlers.get(type(msg))
        if handler is None:
            return self.malformed(peer, errors.MalformedMessageError(
                f"{type(msg).__name__} is not a message the broker accepts"))
        handler(peer, msg, now, out)
        if worker is not None and not worker.cap and isinstance(msg, _REPLIES):  # it stalled, and is back
            self.placement.replied(worker, out)
        return out

    def tick(self, now: float, caught_up: bool = True) -> Output:
        """What is due by ``now`` (broker/timers.py); ``caught_up``: the server has read every
        message that arrived (until it has, no worker is judged silent nor stuck)."""
        return self._timers.tick(now, caught_up)

    def malformed(self, peer: bytes, exc: errors.ProtocolError) -> Output:
        """A frame that did not decode: answer a client, drop a worker's (workers read no ERROR)."""
        return self._endings.malformed(peer, exc)

    def oversized(self, peer: bytes, msg: Message, size: int) -> Output:
        """A message over protocol.MAX_MESSAGE_BYTES (the client library refuses those itself)."""
        self.counters.rejected += 1
        if peer in self.workers:
            return []
        return [(peer, Error(getattr(msg, "request_id", ""), errors.InvalidRequestError.code,
                             f"a {type(msg).__name__} of {size:,} bytes is over the broker's limit of"
                             f" {MAX_MESSAGE_BYTES:,} bytes per message; send a shorter prompt"))]

    def status(self, now: float) -> dict:
        return self._state.describe(now)

    def shutdown(self, now: float) -> Output:
        """Tell every worker to register again (with the next broker on this address), and every
        client heard from lately, or with requests here, that it shut down (they fail at once)."""
        out: Output = [(w.identity, Disconnect()) for w in self.workers.values()]
        recent = now - timing.CLIENT_UNAVAILABLE_S
        clients = {c for c, t in self._clients_heard.items() if t >= recent}
        clients.update(j.client for j in self.jobs.values())
        clients.difference_update(self.workers)  # a worker's READY came before it was one
        out.extend((c, Shutdown("stopped by a signal")) for c in sorted(clients))
        return out

    def _stranger(self, peer: bytes) -> Output:
        """A worker this broker does not know (it restarted, or the worker expired): tell it once."""
        told = self._state.told_to_register
        if peer in told:
            return []
        if len(told) > _MAX_STRANGERS:  # dead peers never register: forget them
            told.clear()
        told.add(peer)
        return [(peer, Disconnect())]
