"""What the Router does as time passes: heartbeats, worker expiry, deadlines, stalls, orphans.

A mixin of broker/router.py's Router (``tick`` is its public entry): time comes in as ``now``,
so tests drive it by hand.
"""

from __future__ import annotations

from ovpool import errors, timing
from ovpool.broker.state import Output
from ovpool.protocol import Heartbeat


class Timers:
    """Part of Router: uses its state and its endings (``_fail``, ``_end_stream``, ``_drop_worker``)."""

    def tick(self, now: float, caught_up: bool = True) -> Output:
        """Timers: heartbeats to workers, worker expiry, request deadlines and progress, stalled
        streams, orphaned queues. ``caught_up``: the server has read every message that arrived;
        until it has, no worker is judged silent nor stuck (its heartbeat or token may be among
        those unread: liveness follows arrival, not how far behind the broker is)."""
        out: Output = []
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + timing.HEARTBEAT_INTERVAL_S
            out.extend((w.identity, Heartbeat()) for w in self.workers.values())
        if caught_up:
            for worker in [w for w in self.workers.values() if now >= w.expires]:
                self._drop_worker(worker, now, out, lost=True)
            self._expire_progress(now, out)
        self._expire_deadlines(now, out)
        self._expire_drain(now, out)
        self._expire_stalled_streams(now, out)
        self._expire_orphans(now, out)
        self.supervised.expire(now)
        self.orders.expire(now)
        self.failures.expire(now, self.supervised)
        return out

    def _expire_progress(self, now: float, out: Output) -> None:
        """A request that got no token for progress_timeout_s (a hung or lying worker) moves on."""
        stuck = now - self.progress_timeout_s
        for job in [j for j in self.jobs.values() if j.worker is not None]:
            if job.progress_at is None:
                job.progress_at = now  # the first tick since its dispatch
            elif job.progress_at <= stuck:
                self.counters.stalled += 1
                self.placement.stall(job, out, now)
                self._forget_failed([job.request_id])

    def _expire_drain(self, now: float, out: Output) -> None:
        """The pool's drain timed out: what is still unfinished fails, saying so."""
        if self.drain is None or now < self.drain.deadline:
            return
        for job in list(self.jobs.values()):
            self.counters.failed += 1
            self._fail(job, self.drain.timed_out(job.request_id), out)

    def _expire_stalled_streams(self, now: float, out: Output) -> None:
        for rid in self.streams.stalled(now):
            exc = errors.ClientTooSlowError(
                f"request {rid}: its client took none of the tokens waiting for it for"
                f" {self.streams.stall_s:g} s (setting stream_stall_s); read the stream faster")
            self.counters.cancelled += 1
            job = self.jobs.get(rid)
            if job is not None:
                self._fail(job, exc, out)
            else:
                self._end_stream(rid, exc, out)

    def _expire_deadlines(self, now: float, out: Output) -> None:
        """Requests past their timeout, and those of clients gone silent (a client pings while it
        waits): their slots would otherwise stay busy for nobody."""
        gone = now - timing.CLIENT_UNAVAILABLE_S
        for job in [j for j in self.jobs.values()
                    if now >= j.deadline or self._clients_heard.get(j.client, now) < gone]:
            if now >= job.deadline:
                self.counters.timed_out += 1
                where = "in the queue" if job.worker is None else "while generating"
                exc = errors.RequestTimeoutError(f"request {job.request_id} reached its timeout {where}")
            else:
                self.counters.cancelled += 1
                exc = errors.CancelledError(f"request {job.request_id}: its client went silent")
            self._fail(job, exc, out)
        if len(self._clients_heard) > len(self.jobs) * 2 + 1000:  # forget clients with nothing left
            live = {j.client for j in self.jobs.values()}
            self._clients_heard = {c: t for c, t in self._clients_heard.items() if c in live}

    def _expire_orphans(self, now: float, out: Output) -> None:
        if now < self.started + timing.BROKER_GRACE_S:
            return
        for model, queue in list(self.queues.items()):  # failing the last request drops its queue
            if self.placement.serves(model) or self.supervised.residency(model)[0] not in ("", "failed"):
                continue  # served, or a supervisor loads it on demand: it waits for that
            for rid in [r for r in queue if now - self.jobs[r].waiting_since >= timing.BROKER_GRACE_S]:
                job = self.jobs[rid]
                self.counters.failed += 1
                self._fail(job, self.placement.orphaned(job), out)
