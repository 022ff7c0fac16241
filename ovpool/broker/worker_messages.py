"""What the Router does with each message from a worker: registration, tokens, endings, heartbeats.

``WorkerMessages`` is given the Router's state and endings (broker/router_state.py);
broker/router.py puts its ``handlers()`` into its dispatch table once, so a message is one lookup
and one call.
"""

from __future__ import annotations

from ovpool import errors, timing
from ovpool.broker import bounds
from ovpool.broker.router_state import Endings, Handler, RouterState
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
    def __init__(self, state: RouterState, endings: Endings):
        self._state = state
        self._endings = endings

    def handlers(self) -> dict[type, Handler]:
        """Each message type this class handles, with its handler."""
        return {Ready: self._on_ready, Partial: self._on_partial, Final: self._on_end, Error: self._on_end,
                Heartbeat: self._on_heartbeat, Disconnect: self._on_disconnect,
                LoadFailed: self._on_load_failed}

    def _on_ready(self, peer: bytes, msg: Ready, now: float, out: Output) -> None:
        state = self._state
        old = state.workers.get(peer)
        if old is not None:  # registering again means it dropped whatever it was running
            self._endings.drop_worker(old, now, out, lost=True)
        info = bounds.fit_ready(msg)
        if info is None or len(state.workers) >= bounds.MAX_WORKERS:
            state.counters.malformed += 1
            return
        state.told_to_register.discard(peer)
        state.failures.registered(info)
        worker = RegisteredWorker(peer, info, expires=now + timing.HEARTBEAT_EXPIRY_S)
        state.placement.add_worker(worker, out)

    def _on_partial(self, peer: bytes, msg: Partial, now: float, out: Output) -> None:
        state = self._state
        job = _job_on(state, peer, msg.request_id, out)
        if job is None:
            return
        job.progress_at = now
        if job.next_seq <= msg.seq < job.max_tokens:
            job.next_seq = msg.seq + 1
            if msg.request_id in state.streams:
                state.streams.partial(msg, now, out)
        elif msg.seq >= job.max_tokens:
            state.counters.malformed += 1

    def _on_end(self, peer: bytes, msg: Final | Error, now: float, out: Output) -> None:
        state = self._state
        job = _job_on(state, peer, msg.request_id, out)
        if job is None:
            return
        if isinstance(msg, Final):
            state.counters.completed += 1
            answer = msg.completion.get("text")
            answer = answer if isinstance(answer, str) else ""
            state.placement.finished_on(state.workers[peer], job, answer)
        else:
            state.counters.failed += 1
        if msg.request_id in state.streams:
            state.streams.end(msg, out)
        else:
            out.append((job.client, msg))
        state.placement.finish(job, out)

    def _on_heartbeat(self, peer: bytes, msg: Heartbeat, now: float, out: Output) -> None:
        """A worker's heartbeat (its expiry is refreshed in handle()) with its prefix-cache summary."""
        state = self._state
        try:
            held = route_keys_from_wire(msg.held)
        except errors.MalformedMessageError:
            state.counters.malformed += 1
            return
        state.placement.report(state.workers[peer], held, msg)

    def _on_disconnect(self, peer: bytes, msg: Disconnect, now: float, out: Output) -> None:
        worker = self._state.workers.get(peer)
        if worker is not None:
            self._endings.drop_worker(worker, now, out, lost=False)

    def _on_load_failed(self, peer: bytes, msg: LoadFailed, now: float, out: Output) -> None:
        """A worker that could not load its model: what waits for its models (or for any, unnamed)
        with no other worker serving them fails now, saying why."""
        state = self._state
        msg = bounds.fit_load_failed(msg)
        if msg is None:
            state.counters.malformed += 1
            return
        state.failures.record(msg, now)
        for model in [*msg.models, ""]:
            if state.placement.serves(model) or model not in state.queues:
                continue
            self._endings.fail_queue(model, state.admission.not_served(model), out)


def _job_on(state: RouterState, peer: bytes, request_id: str, out: Output) -> Job | None:
    """The job ``peer`` runs as ``request_id``, else None (and ``peer`` told to stop it)."""
    job = state.jobs.get(request_id)
    if job is None or job.worker != peer:
        if request_id:  # stale work (cancelled, timed out or re-dispatched): stop it
            out.append((peer, Cancel(request_id)))
        return None
    return job
