"""What the Router does with each message from a client, or from a supervisor (``ovpool serve``).

A mixin of broker/router.py's Router: its methods read and change the Router's state (jobs, streams,
placement, admission) and are bound into its dispatch table once, so a message costs no more than
it did when they lived there.
"""

from __future__ import annotations

from ovpool import errors
from ovpool.broker import bounds, drain
from ovpool.broker.admission import cannot_load
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
    """Part of Router: uses its state and its endings (``_fail``, ``_end_stream``, ``_drop_worker``)."""

    def _on_submit(self, peer: bytes, msg: Submit, now: float, out: Output) -> None:
        known = self.jobs.get(msg.request_id)
        owner = known.client if known is not None else self.streams.client(msg.request_id)
        if owner == peer:
            return  # a resend of a request this broker runs (or still streams): nothing to do
        if owner is not None:  # never re-route someone else's stream to this sender
            self.counters.rejected += 1
            out.append((peer, Error(msg.request_id, errors.InvalidRequestError.code,
                                    f"request id {msg.request_id!r} is in use by another client;"
                                    " give each request a fresh id")))
            return
        if self.drain is not None:
            self.counters.rejected += 1
            out.append((peer, Error(msg.request_id, errors.DrainingError.code,
                                    str(self.drain.refusal(msg.request_id)))))
            return
        try:
            job = self.admission.admit(peer, msg, now)
        except errors.RequestError as exc:
            self.counters.rejected += 1
            out.append((peer, Error(msg.request_id, exc.code, str(exc))))
            return
        self.counters.submitted += 1
        self.keep_alives.note(job.model, job.keep_alive_s)
        if msg.window > 0:  # no stream takes more PARTIALs than its max_tokens
            self.streams.open(job.request_id, peer, min(msg.window, job.max_tokens))
        self.placement.submit(job, out)

    def _on_cancel(self, peer: bytes, msg: Cancel, now: float, out: Output) -> None:
        job = self.jobs.get(msg.request_id)
        exc = errors.CancelledError("cancelled by the client")
        if job is not None and job.client == peer:
            self.counters.cancelled += 1
            self._fail(job, exc, out)
        elif job is None and self.streams.client(msg.request_id) == peer:  # generated, not yet read
            self._end_stream(msg.request_id, exc, out)

    def _on_credit(self, peer: bytes, msg: Credit, now: float, out: Output) -> None:
        self.streams.credit(peer, msg.request_id, msg.tokens, now, out)

    def _on_status(self, peer: bytes, msg: Status, now: float, out: Output) -> None:
        out.append((peer, StatusReply(self.status(now))))

    def _on_ping(self, peer: bytes, msg: Ping, now: float, out: Output) -> None:
        out.append((peer, Pong([rid for rid in msg.request_ids
                                if type(rid) is str and rid not in self.jobs and rid not in self.streams])))

    def _on_drain(self, peer: bytes, msg: Drain, now: float, out: Output) -> None:
        if msg.worker:
            for worker in drain.named(self.workers.values(), msg.worker):
                self.placement.drain_worker(worker)
        else:
            self.drain = drain.start(self.drain, now, msg.timeout_s)
        out.append((peer, StatusReply(self.status(now))))

    def _on_model_order(self, peer: bytes, msg: ModelOrder, now: float, out: Output) -> None:
        """Kept for the serve that loads ``msg.model`` on demand (it checks the model is its own);
        answered with the status, whose ``supervised`` says which models those are."""
        if msg.action in ("load", "unload") and bounds.is_name(msg.model) \
                and self.supervised.residency(msg.model)[0]:
            self.orders.add(msg.model, msg.action, now)
        out.append((peer, StatusReply(self.status(now))))

    def _on_supervised(self, peer: bytes, msg: Supervised, now: float, out: Output) -> None:
        if not bounds.fit_supervised(msg):
            out.extend(self.malformed(peer, errors.MalformedMessageError(
                "Supervised.workers must be a list of maps of text and numbers"
                f" (of size {bounds.MAX_REPORT_SIZE:,} at most)")))
            return
        self.supervised.update(msg, now)
        for model in {w.get("model") for w in msg.workers} - {None}:
            state, reason = self.supervised.residency(model)
            if state == "failed" and not self.placement.serves(model):  # its queue waits in vain
                for rid in list(self.queues.get(model, ())):
                    self.counters.failed += 1
                    self._fail(self.jobs[rid], cannot_load(model, reason), out)
