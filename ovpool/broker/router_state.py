"""The Router's state as one explicit object, and the endings every one of its handlers shares.

``RouterState`` holds what the broker's routing core remembers (counters, placement and its views,
streams, admission, load failures, supervisors' reports, model orders, keep-alives, the pool's
drain, the peers it heard from); broker/router.py builds it and hands it to the handlers of
broker/client_messages.py, broker/worker_messages.py and broker/timers.py, with one ``Endings``
over it: how a request, a stream or a worker ends, and the answer to a malformed message.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from ovpool import errors
from ovpool.broker import drain
from ovpool.broker.admission import Admission
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
from ovpool.protocol import Error

# A message's handler: (peer, message, now, out); what it sends goes on ``out``.
Handler = Callable[[bytes, Any, float, Output], None]


class RouterState:
    """Placement is the only code that changes ``workers``, ``jobs`` and ``queues`` (its views here)."""

    __slots__ = ("started", "counters", "placement", "streams", "progress_timeout_s", "workers", "jobs",
                 "queues", "failures", "supervised", "orders", "keep_alives", "admission",
                 "told_to_register", "clients_heard", "next_heartbeat", "drain")

    def __init__(self, *, now: float, queue_limit: int, max_new_tokens: int, max_attempts: int,
                 stream_stall_s: float, progress_timeout_s: float, prefix_routing: bool):
        self.started = now
        self.counters = Counters()
        self.placement = Placement(max_attempts=max_attempts, counters=self.counters,
                                   prefix_routing=prefix_routing)
        self.streams = Streams(stream_stall_s)
        self.progress_timeout_s = progress_timeout_s
        self.workers = self.placement.workers
        self.jobs = self.placement.jobs
        self.queues = self.placement.queues
        self.failures = LoadFailures()
        self.supervised = SupervisedHosts()
        self.orders = ModelOrders(secrets.token_hex(4))
        self.keep_alives = KeepAlives()
        self.admission = Admission(self.placement, self.failures, started=now, queue_limit=queue_limit,
                                   max_new_tokens=max_new_tokens, supervised=self.supervised)
        self.told_to_register: set[bytes] = set()  # unknown workers told to register, once each
        self.clients_heard: dict[bytes, float] = {}  # changed in place: Router keeps a reference
        self.next_heartbeat = now
        self.drain: drain.PoolDrain | None = None

    def describe(self, now: float) -> dict:
        """What STATUS answers."""
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


class Endings:
    """How requests, streams and workers end, the same whichever message or timer ends them."""

    def __init__(self, state: RouterState):
        self._state = state

    def fail(self, job: Job, exc: errors.OvpoolError, out: Output) -> None:
        """End ``job`` with ``exc`` now: what its stream still held is dropped, never delivered."""
        self._state.streams.drop(job.request_id)
        self._state.placement.fail(job, exc, out)

    def fail_queue(self, model: str, exc: errors.OvpoolError, out: Output) -> None:
        """End every request waiting for ``model`` with ``exc`` (nothing will serve them)."""
        state = self._state
        for rid in list(state.queues.get(model, ())):
            state.counters.failed += 1
            self.fail(state.jobs[rid], exc, out)

    def end_stream(self, request_id: str, exc: errors.OvpoolError, out: Output) -> None:
        """End a stream whose generation is over (only its delivery was left) with ``exc``."""
        streams = self._state.streams
        client = streams.client(request_id)
        streams.drop(request_id)
        out.append((client, Error(request_id, exc.code, str(exc))))

    def drop_worker(self, worker: RegisteredWorker, now: float, out: Output, *, lost: bool) -> None:
        running = list(worker.inflight)
        self._state.placement.drop_worker(worker, now, out, lost=lost)
        self.forget_failed(running)

    def forget_failed(self, request_ids: list[str]) -> None:
        """Placement failed those of ``request_ids`` it no longer knows (WorkerLost): their streams
        end with that ERROR, so nothing they held is sent after it."""
        for rid in request_ids:
            if rid not in self._state.jobs:
                self._state.streams.drop(rid)

    def malformed(self, peer: bytes, exc: errors.ProtocolError) -> Output:
        """A message that did not decode or fit: answer a client, drop a worker's (workers read no ERROR)."""
        self._state.counters.malformed += 1
        if peer in self._state.workers:
            return []
        return [(peer, Error("", exc.code, str(exc)))]
