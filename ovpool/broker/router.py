"""The broker's routing core: decoded messages in, (peer, message) pairs out. No sockets, no clock.

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
from ovpool.broker import bounds, drain
from ovpool.broker.admission import Admission, cannot_load
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
    Pong,
    Ready,
    Shutdown,
    Status,
    StatusReply,
    Submit,
    Supervised,
    route_keys_from_wire,
)

MAX_ATTEMPTS = 3
_MAX_STRANGERS = 10_000
_REPLIES = (Partial, Final, Error)
# Credit goes back to a worker in quarters of its window: one CREDIT per ~1,000 replies, and the
# worker never waits for one unless the broker is that far behind.
_ACK_EVERY = WORKER_WINDOW // 4


class Router:
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

    # -- client messages ------------------------------------------------------------------------

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

    # -- worker messages ------------------------------------------------------------------------

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

    def _job_on(self, peer: bytes, request_id: str, out: Output) -> Job | None:
        job = self.jobs.get(request_id)
        if job is None or job.worker != peer:
            if request_id:  # stale work (cancelled, timed out or re-dispatched): stop it
                out.append((peer, Cancel(request_id)))
            return None
        return job

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
