"""What the Router does as time passes: heartbeats, worker expiry, deadlines, stalls, orphans.

``Timers`` is given the Router's state and endings (broker/router_state.py); Router.tick is its
``tick``. Time comes in as ``now``, so tests drive it by hand.
"""

from __future__ import annotations

from ovpool import errors, timing
from ovpool.broker.router_state import Endings, RouterState
from ovpool.broker.state import Output
from ovpool.protocol import Heartbeat


class Timers:
    def __init__(self, state: RouterState, endings: Endings):
        self._state = state
        self._endings = endings

    def tick(self, now: float, caught_up: bool = True) -> Output:
        """Timers: heartbeats to workers, worker expiry, request deadlines and progress, stalled
        streams, orphaned queues. ``caught_up``: the server has read every message that arrived;
        until it has, no worker is judged silent nor stuck (its heartbeat or token may be among
        those unread: liveness follows arrival, not how far behind the broker is)."""
        state = self._state
        out: Output = []
        if now >= state.next_heartbeat:
            state.next_heartbeat = now + timing.HEARTBEAT_INTERVAL_S
            out.extend((w.identity, Heartbeat()) for w in state.workers.values())
        if caught_up:
            for worker in [w for w in state.workers.values() if now >= w.expires]:
                self._endings.drop_worker(worker, now, out, lost=True)
            self._expire_progress(now, out)
        self._expire_deadlines(now, out)
        self._expire_drain(now, out)
        self._expire_stalled_streams(now, out)
        self._expire_orphans(now, out)
        state.supervised.expire(now)
        state.orders.expire(now)
        state.failures.expire(now, state.supervised)
        return out

    def _expire_progress(self, now: float, out: Output) -> None:
        """A request that got no token for progress_timeout_s (a hung or lying worker) moves on."""
        state = self._state
        stuck = now - state.progress_timeout_s
        for job in [j for j in state.jobs.values() if j.worker is not None]:
            if job.progress_at is None:
                job.progress_at = now  # the first tick since its dispatch
            elif job.progress_at <= stuck:
                state.counters.stalled += 1
                state.placement.stall(job, out, now)
                self._endings.forget_failed([job.request_id])

    def _expire_drain(self, now: float, out: Output) -> None:
        """The pool's drain timed out: what is still unfinished fails, saying so."""
        state = self._state
        if state.drain is None or now < state.drain.deadline:
            return
        for job in list(state.jobs.values()):
            state.counters.failed += 1
            self._endings.fail(job, state.drain.timed_out(job.request_id), out)

    def _expire_stalled_streams(self, now: float, out: Output) -> None:
        state = self._state
        for rid in state.streams.stalled(now):
            exc = errors.ClientTooSlowError(
                f"request {rid}: its client took none of the tokens waiting for it for"
                f" {state.streams.stall_s:g} s (setting stream_stall_s); read the stream faster")
            state.counters.cancelled += 1
            job = state.jobs.get(rid)
            if job is not None:
                self._endings.fail(job, exc, out)
            else:
                self._endings.end_stream(rid, exc, out)

    def _expire_deadlines(self, now: float, out: Output) -> None:
        """Requests past their timeout, and those of clients gone silent (a client pings while it
        waits): their slots would otherwise stay busy for nobody."""
        state = self._state
        gone = now - timing.CLIENT_UNAVAILABLE_S
        heard = state.clients_heard
        for job in [j for j in state.jobs.values()
                    if now >= j.deadline or heard.get(j.client, now) < gone]:
            if now >= job.deadline:
                state.counters.timed_out += 1
                where = "in the queue" if job.worker is None else "while generating"
                exc = errors.RequestTimeoutError(f"request {job.request_id} reached its timeout {where}")
            else:
                state.counters.cancelled += 1
                exc = errors.CancelledError(f"request {job.request_id}: its client went silent")
            self._endings.fail(job, exc, out)
        if len(heard) > len(state.jobs) * 2 + 1000:  # forget clients with nothing left
            live = {j.client for j in state.jobs.values()}
            for client in [c for c in heard if c not in live]:
                del heard[client]

    def _expire_orphans(self, now: float, out: Output) -> None:
        state = self._state
        if now < state.started + timing.BROKER_GRACE_S:
            return
        for model, queue in list(state.queues.items()):  # failing the last request drops its queue
            if state.placement.serves(model) or \
                    state.supervised.residency(model)[0] not in ("", "failed"):
                continue  # served, or a supervisor loads it on demand: it waits for that
            for rid in [r for r in queue if now - state.jobs[r].waiting_since >= timing.BROKER_GRACE_S]:
                job = state.jobs[rid]
                state.counters.failed += 1
                self._endings.fail(job, state.placement.orphaned(job), out)
