"""The broker's routing core: decoded messages in, (peer, message) pairs out. No sockets, no clock.

The Router holds the state and dispatches; what it does with each message lives with its sender
(broker/client_messages.py, broker/worker_messages.py) and what it does as time passes in
broker/timers.py, mixins bound into one dispatch table at construction.

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

import secrets

from ovpool import errors, timing
from ovpool.broker import drain
from ovpool.broker.admission import Admission
from ovpool.broker.client_messages import ClientMessages
from ovpool.broker.placement import Placement
from ovpool.broker.state import (
    Counters,
    Job,
    KeepAlives,
    LoadFailures,
    ModelOrders,
    Output,
    RegisteredWorker,
    SupervisedHosts,
)
from ovpool.broker.streams import Streams
from ovpool.broker.timers import Timers
from ovpool.broker.worker_messages import WorkerMessages
from ovpool.protocol import (
    MAX_MESSAGE_BYTES,
    WORKER_WINDOW,
    Cancel,
    Credit,
    Disconnect,
    Drain,
    Error,
    Final,
    Heartbeat,
    LoadFailed,
    Message,
    ModelOrder,
    Partial,
    Ping,
    Ready,
    Shutdown,
    Status,
    Submit,
    Supervised,
)

MAX_ATTEMPTS = 3
_MAX_STRANGERS = 10_000
_REPLIES = (Partial, Final, Error)
# Credit goes back to a worker in quarters of its window: one CREDIT per ~1,000 replies, and the
# worker never waits for one unless the broker is that far behind.
_ACK_EVERY = WORKER_WINDOW // 4


class Router(ClientMessages, WorkerMessages, Timers):
    def __init__(self, *, now: float, queue_limit: int = 256, max_new_tokens: int = 4096,
                 max_attempts: int = MAX_ATTEMPTS, stream_stall_s: float = 30.0,
                 progress_timeout_s: float = 60.0, prefix_routing: bool = True):
        self.started = now
        self.counters = Counters()
        self.placement = Placement(max_attempts=max_attempts, counters=self.counters,
                                   prefix_routing=prefix_routing)
        self.streams = Streams(stream_stall_s)
        self.progress_timeout_s = progress_timeout_s
        self.workers = self.placement.workers  # read-only views: Placement changes them
        self.jobs = self.placement.jobs
        self.queues = self.placement.queues
        self.failures = LoadFailures()
        self.supervised = SupervisedHosts()
        self.orders = ModelOrders(secrets.token_hex(4))
        self.keep_alives = KeepAlives()
        self.admission = Admission(self.placement, self.failures, started=now, queue_limit=queue_limit,
                                   max_new_tokens=max_new_tokens, supervised=self.supervised)
        self._told_to_register: set[bytes] = set()
        self._clients_heard: dict[bytes, float] = {}
        self._next_heartbeat = now
        self.drain: drain.PoolDrain | None = None
        self._handlers = {Submit: self._on_submit, Cancel: self._on_cancel, Credit: self._on_credit,
                          Status: self._on_status,
                          Ping: self._on_ping, Supervised: self._on_supervised,
                          Ready: self._on_ready, Partial: self._on_partial,
                          Final: self._on_end, Error: self._on_end,
                          Disconnect: self._on_disconnect, LoadFailed: self._on_load_failed,
                          Heartbeat: self._on_heartbeat, Drain: self._on_drain,
                          ModelOrder: self._on_model_order}

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
        elif isinstance(msg, (Heartbeat, *_REPLIES)):
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

    def malformed(self, peer: bytes, exc: errors.ProtocolError) -> Output:
        """A frame that did not decode: answer a client, drop a worker's (workers read no ERROR)."""
        self.counters.malformed += 1
        if peer in self.workers:
            return []
        return [(peer, Error("", exc.code, str(exc)))]

    def oversized(self, peer: bytes, msg: Message, size: int) -> Output:
        """A message over protocol.MAX_MESSAGE_BYTES (the client library refuses those itself)."""
        self.counters.rejected += 1
        if peer in self.workers:
            return []
        return [(peer, Error(getattr(msg, "request_id", ""), errors.InvalidRequestError.code,
                             f"a {type(msg).__name__} of {size:,} bytes is over the broker's limit of"
                             f" {MAX_MESSAGE_BYTES:,} bytes per message; send a shorter prompt"))]

    def status(self, now: float) -> dict:
        return {
            "uptime_s": round(now - self.started, 3),
            "workers": [w.describe(now) for w in self.workers.values()],
            **self.placement.status(),
            "counters": self.counters.as_dict(),
            "streams": {"open": len(self.streams), "held": self.streams.held()},
            "supervised": self.supervised.entries(),
            "failed": self.failures.entries(now),
            "model_orders": self.orders.entries(),
            "keep_alive": self.keep_alives.entries(),
            "draining": {"pool": self.drain.describe(now) if self.drain else None,
                         "workers": [w.info.worker_id for w in self.workers.values() if w.draining]},
        }

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

    # -- endings --------------------------------------------------------------------------------

    def _fail(self, job: Job, exc: errors.OvpoolError, out: Output) -> None:
        """End ``job`` with ``exc`` now: what its stream still held is dropped, never delivered."""
        self.streams.drop(job.request_id)
        self.placement.fail(job, exc, out)

    def _end_stream(self, request_id: str, exc: errors.OvpoolError, out: Output) -> None:
        """End a stream whose generation is over (only its delivery was left) with ``exc``."""
        client = self.streams.client(request_id)
        self.streams.drop(request_id)
        out.append((client, Error(request_id, exc.code, str(exc))))

    def _drop_worker(self, worker: RegisteredWorker, now: float, out: Output, *, lost: bool) -> None:
        running = list(worker.inflight)
        self.placement.drop_worker(worker, now, out, lost=lost)
        self._forget_failed(running)

    def _forget_failed(self, request_ids: list[str]) -> None:
        """Placement failed those of ``request_ids`` it no longer knows (WorkerLost): their streams
        end with that ERROR, so nothing they held is sent after it."""
        for rid in request_ids:
            if rid not in self.jobs:
                self.streams.drop(rid)

    def _stranger(self, peer: bytes) -> Output:
        """A worker this broker does not know (it restarted, or the worker expired): tell it once."""
        if peer in self._told_to_register:
            return []
        if len(self._told_to_register) > _MAX_STRANGERS:  # dead peers never register: forget them
            self._told_to_register.clear()
        self._told_to_register.add(peer)
        return [(peer, Disconnect())]

