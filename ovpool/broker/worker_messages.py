"""What the Router does with each message from a worker: registration, tokens, endings, heartbeats.

A mixin of broker/router.py's Router: its methods read and change the Router's state and are bound
into its dispatch table once, so a message costs no more than it did when they lived there.
"""

from __future__ import annotations

from ovpool import errors, timing
from ovpool.broker import bounds
from ovpool.broker.state import Job, Output, RegisteredWorker
from ovpool.protocol import (
    Cancel,
    Disconnect,
    Error,
    Final,
    Heartbeat,
    LoadFailed,
    Partial,
    Ready,
    route_keys_from_wire,
)


class WorkerMessages:
    """Part of Router: uses its state and its endings (``_fail``, ``_end_stream``, ``_drop_worker``)."""

    def _on_ready(self, peer: bytes, msg: Ready, now: float, out: Output) -> None:
        old = self.workers.get(peer)
        if old is not None:  # registering again means it dropped whatever it was running
            self._drop_worker(old, now, out, lost=True)
        info = bounds.fit_ready(msg)
        if info is None or len(self.workers) >= bounds.MAX_WORKERS:
            self.counters.malformed += 1
            return
        self._told_to_register.discard(peer)
        self.failures.registered(info)
        self.placement.add_worker(RegisteredWorker(peer, info, expires=now + timing.HEARTBEAT_EXPIRY_S), out)

    def _on_partial(self, peer: bytes, msg: Partial, now: float, out: Output) -> None:
        job = self._job_on(peer, msg.request_id, out)
        if job is None:
            return
        job.progress_at = now
        if job.next_seq <= msg.seq < job.max_tokens:
            job.next_seq = msg.seq + 1
            if msg.request_id in self.streams:
                self.streams.partial(msg, now, out)
        elif msg.seq >= job.max_tokens:
            self.counters.malformed += 1

    def _on_end(self, peer: bytes, msg: Final | Error, now: float, out: Output) -> None:
        job = self._job_on(peer, msg.request_id, out)
        if job is None:
            return
        if isinstance(msg, Final):
            self.counters.completed += 1
            answer = msg.completion.get("text")
            self.placement.finished_on(self.workers[peer], job, answer if isinstance(answer, str) else "")
        else:
            self.counters.failed += 1
        if msg.request_id in self.streams:
            self.streams.end(msg, out)
        else:
            out.append((job.client, msg))
        self.placement.finish(job, out)

    def _on_heartbeat(self, peer: bytes, msg: Heartbeat, now: float, out: Output) -> None:
        """A worker's heartbeat (its expiry is refreshed in handle()) with its prefix-cache summary."""
        try:
            held = route_keys_from_wire(msg.held)
        except errors.MalformedMessageError:
            self.counters.malformed += 1
            return
        self.placement.report(self.workers[peer], held, msg)

    def _on_disconnect(self, peer: bytes, msg: Disconnect, now: float, out: Output) -> None:
        worker = self.workers.get(peer)
        if worker is not None:
            self._drop_worker(worker, now, out, lost=False)

    def _on_load_failed(self, peer: bytes, msg: LoadFailed, now: float, out: Output) -> None:
        """A worker that could not load its model: what waits for its models (or for any, unnamed)
        with no other worker serving them fails now, saying why."""
        msg = bounds.fit_load_failed(msg)
        if msg is None:
            self.counters.malformed += 1
            return
        self.failures.record(msg, now)
        for model in [*msg.models, ""]:
            if self.placement.serves(model):
                continue
            for rid in list(self.queues.get(model, ())):
                self.counters.failed += 1
                self._fail(self.jobs[rid], self.admission.not_served(model), out)

    def _job_on(self, peer: bytes, request_id: str, out: Output) -> Job | None:
        job = self.jobs.get(request_id)
        if job is None or job.worker != peer:
            if request_id:  # stale work (cancelled, timed out or re-dispatched): stop it
                out.append((peer, Cancel(request_id)))
            return None
        return job
