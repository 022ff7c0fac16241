"""What the Router does with each message from a client, or from a supervisor (``ovpool serve``).

``ClientMessages`` is given the Router's state and endings (broker/router_state.py); broker/router.py
puts its ``handlers()`` into its dispatch table once, so a message is one lookup and one call.
"""

from __future__ import annotations

from ovpool import errors
from ovpool.broker import bounds, drain
from ovpool.broker.admission import cannot_load
from ovpool.broker.router_state import Endings, Handler, RouterState
from ovpool.broker.state import Output
from ovpool.protocol import (
    Cancel,
    Credit,
    Drain,
    Error,
    ModelOrder,
    Ping,
    Pong,
    Status,
    StatusReply,
    Submit,
    Supervised,
)


class ClientMessages:
    def __init__(self, state: RouterState, endings: Endings):
        self._state = state
        self._endings = endings

    def handlers(self) -> dict[type, Handler]:
        """Each message type this class handles, with its handler."""
        return {Submit: self._on_submit, Cancel: self._on_cancel, Credit: self._on_credit,
                Status: self._on_status, Ping: self._on_ping, Drain: self._on_drain,
                ModelOrder: self._on_model_order, Supervised: self._on_supervised}

    def _on_submit(self, peer: bytes, msg: Submit, now: float, out: Output) -> None:
        state = self._state
        known = state.jobs.get(msg.request_id)
        owner = known.client if known is not None else state.streams.client(msg.request_id)
        if owner == peer:
            return  # a resend of a request this broker runs (or still streams): nothing to do
        if owner is not None:  # never re-route someone else's stream to this sender
            state.counters.rejected += 1
            out.append((peer, Error(msg.request_id, errors.InvalidRequestError.code,
                                    f"request id {msg.request_id!r} is in use by another client;"
                                    " give each request a fresh id")))
            return
        if state.drain is not None:
            state.counters.rejected += 1
            out.append((peer, Error(msg.request_id, errors.DrainingError.code,
                                    str(state.drain.refusal(msg.request_id)))))
            return
        try:
            job = state.admission.admit(peer, msg, now)
        except errors.RequestError as exc:
            state.counters.rejected += 1
            out.append((peer, Error(msg.request_id, exc.code, str(exc))))
            return
        state.counters.submitted += 1
        state.keep_alives.note(job.model, job.keep_alive_s)
        if msg.window > 0:  # no stream takes more PARTIALs than its max_tokens
            state.streams.open(job.request_id, peer, min(msg.window, job.max_tokens))
        state.placement.submit(job, out)

    def _on_cancel(self, peer: bytes, msg: Cancel, now: float, out: Output) -> None:
        state = self._state
        job = state.jobs.get(msg.request_id)
        exc = errors.CancelledError("cancelled by the client")
        if job is not None and job.client == peer:
            state.counters.cancelled += 1
            self._endings.fail(job, exc, out)
        elif job is None and state.streams.client(msg.request_id) == peer:  # generated, not yet read
            self._endings.end_stream(msg.request_id, exc, out)

    def _on_credit(self, peer: bytes, msg: Credit, now: float, out: Output) -> None:
        self._state.streams.credit(peer, msg.request_id, msg.tokens, now, out)

    def _on_status(self, peer: bytes, msg: Status, now: float, out: Output) -> None:
        out.append((peer, StatusReply(self._state.describe(now))))

    def _on_ping(self, peer: bytes, msg: Ping, now: float, out: Output) -> None:
        jobs, streams = self._state.jobs, self._state.streams
        out.append((peer, Pong([rid for rid in msg.request_ids
                                if type(rid) is str and rid not in jobs and rid not in streams])))

    def _on_drain(self, peer: bytes, msg: Drain, now: float, out: Output) -> None:
        state = self._state
        if msg.worker:
            for worker in drain.named(state.workers.values(), msg.worker):
                state.placement.drain_worker(worker)
        else:
            state.drain = drain.start(state.drain, now, msg.timeout_s)
        out.append((peer, StatusReply(state.describe(now))))

    def _on_model_order(self, peer: bytes, msg: ModelOrder, now: float, out: Output) -> None:
        """Kept for the serve that loads ``msg.model`` on demand (it checks the model is its own);
        answered with the status, whose ``supervised`` says which models those are."""
        state = self._state
        if msg.action in ("load", "unload") and bounds.is_name(msg.model) \
                and state.supervised.residency(msg.model)[0]:
            state.orders.add(msg.model, msg.action, now)
        out.append((peer, StatusReply(state.describe(now))))

    def _on_supervised(self, peer: bytes, msg: Supervised, now: float, out: Output) -> None:
        state = self._state
        if not bounds.fit_supervised(msg):
            out.extend(self._endings.malformed(peer, errors.MalformedMessageError(
                "Supervised.workers must be a list of maps of text and numbers"
                f" (of size {bounds.MAX_REPORT_SIZE:,} at most)")))
            return
        state.supervised.update(msg, now)
        for model in {w.get("model") for w in msg.workers} - {None}:
            residency, reason = state.supervised.residency(model)
            if residency == "failed" and not state.placement.serves(model):  # its queue waits in vain
                self._endings.fail_queue(model, cannot_load(model, reason), out)
