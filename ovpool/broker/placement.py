"""The broker's queues and slots: which request waits where and which worker runs it.

Router (the protocol) owns one Placement and changes placement state only through its methods;
Placement holds every invariant about it:

- a request is either queued (in its model's FIFO) or in flight on exactly one worker;
- a worker's ``inflight`` never exceeds its slots nor the broker's cap on them
  (RegisteredWorker.cap); a request goes to a worker with a free slot whenever there is one;
- which one: with ``prefix_routing``, of the free workers whose busy fraction is within
  ``AFFINITY_SLACK`` of the least busy, the one believed to hold the longest prefix of the
  request's prompt (broker/prefixes.py), or whose host's KV tier does, worth a little less
  (broker/host_tiers.py; ties to the least busy); otherwise, or when none holds any, the least
  busy (first registered among equals);
- a lost worker's requests, and one that stalled (``stall``), go back to the head of their queue,
  at most ``max_attempts`` dispatches per request, then WorkerLost; a draining worker
  (``drain_worker``) gets none, and what it hands back when it leaves costs no attempt.

``workers``, ``jobs`` and ``queues`` are read-only views for the Router; a Job's ``client``,
``next_seq`` and ``progress_at`` are the Router's (which peer hears the stream, how far, and when
it last moved; dispatch resets ``progress_at`` to None), the rest is placement's.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from types import MappingProxyType

from ovpool import errors
from ovpool.broker.host_tiers import HostTiers
from ovpool.broker.state import Counters, Job, Output, RegisteredWorker
from ovpool.prefix_key import after_answer, route_keys
from ovpool.protocol import Cancel, Error, Heartbeat

# How much busier (in busy fraction) than the least busy free worker the one holding a request's
# prefix may be and still get it: 2 of 8 slots. Prefilling a ~1,000-token shared system prompt
# costs about as much as a few decode steps of a batch, so a small imbalance pays; a large one
# would pile every chat sharing a system prompt onto the first worker that ran one.
AFFINITY_SLACK = 0.25


def _takes_more(w: RegisteredWorker) -> bool:
    """A free slot (within the broker's cap), and not being drained."""
    return len(w.inflight) < w.cap and not w.draining


def _busy(w: RegisteredWorker) -> float:
    return len(w.inflight) / w.info.slots


def _lost(job: Job) -> str:
    return (f"request {job.request_id} lost its worker {job.attempts} times (each died, went silent or"
            " made no progress while running it): it may be too expensive for the workers or crash"
            " them; retry with a shorter prompt, fewer tokens or a simpler response_format")


class Placement:
    def __init__(self, *, max_attempts: int, counters: Counters, prefix_routing: bool = True):
        self.max_attempts = max_attempts
        self.counters = counters
        self.prefix_routing = prefix_routing
        self.host_tiers = HostTiers()
        self._workers: dict[bytes, RegisteredWorker] = {}
        self._jobs: dict[str, Job] = {}
        self._queues: dict[str, deque[str]] = {}
        self._by_model: dict[str, list[RegisteredWorker]] = {}
        self.workers = MappingProxyType(self._workers)
        self.jobs = MappingProxyType(self._jobs)
        self.queues = MappingProxyType(self._queues)

    # -- questions ------------------------------------------------------------------------------

    def serves(self, model: str) -> bool:
        return bool(self._by_model.get(model))

    def served(self) -> list[str]:
        """Every model (and alias) some worker serves now, sorted."""
        return sorted(m for m, ws in self._by_model.items() if ws)

    def only_model(self) -> str | None:
        """The model every worker serves first (its other names are aliases), if there is one."""
        primaries = {w.info.models[0] for w in self._workers.values()}
        return primaries.pop() if len(primaries) == 1 else None

    def queued(self, model: str) -> int:
        return len(self._queues.get(model, ()))

    def unseen_models(self) -> int:
        """Models requests wait for that no worker serves (yet): a restarted broker's grace."""
        return sum(1 for m, q in self._queues.items() if q and not self.serves(m))

    def has_free_slot(self, model: str) -> bool:
        return any(_takes_more(w) for w in self._by_model.get(model, ()))

    def status(self) -> dict:
        return {
            "queues": {m: len(q) for m, q in self._queues.items()},
            "in_flight": sum(len(w.inflight) for w in self._workers.values()),
        }

    # -- changes --------------------------------------------------------------------------------

    def add_worker(self, worker: RegisteredWorker, out: Output) -> None:
        self._workers[worker.identity] = worker
        for model in worker.info.models:
            self._by_model.setdefault(model, []).append(worker)
        self._adopt_unnamed()
        for model in worker.info.models:
            self._dispatch(model, out)

    def submit(self, job: Job, out: Output) -> None:
        """Queue an admitted request at the tail of its model's FIFO and dispatch what fits."""
        self._jobs[job.request_id] = job
        self._queues.setdefault(job.model, deque()).append(job.request_id)
        self._dispatch(job.model, out)

    def finish(self, job: Job, out: Output) -> None:
        """Forget ``job`` and free its slot or queue place."""
        del self._jobs[job.request_id]
        worker = self._workers.get(job.worker) if job.worker is not None else None
        if worker is None:
            queue = self._queues[job.model]
            queue.remove(job.request_id)
            if not queue and not self.serves(job.model):  # a name no worker serves: keep no queue
                del self._queues[job.model]
            return
        worker.inflight.discard(job.request_id)
        for model in worker.info.models:
            self._dispatch(model, out)

    def fail(self, job: Job, exc: errors.OvpoolError, out: Output) -> None:
        """End ``job`` with ``exc``: cancel it on its worker, tell its client, free its place."""
        if job.worker is not None:
            out.append((job.worker, Cancel(job.request_id)))
        out.append((job.client, Error(job.request_id, exc.code, str(exc))))
        self.finish(job, out)

    def drop_worker(self, worker: RegisteredWorker, now: float, out: Output, *, lost: bool) -> None:
        """``worker`` is gone (``lost``) or handed its work back: requeue its requests at the head."""
        del self._workers[worker.identity]
        for model in worker.info.models:
            self._by_model[model].remove(worker)
            if not self._by_model[model]:  # names come and go with workers: keep only served ones
                del self._by_model[model]
        for rid in sorted(worker.inflight, key=lambda r: self._jobs[r].queued_at, reverse=True):
            self._requeue(self._jobs[rid], now, out, lost=lost)
        for model in worker.info.models:
            self._dispatch(model, out)
            if not self.serves(model) and not self._queues.get(model, True):
                del self._queues[model]

    def drain_worker(self, worker: RegisteredWorker) -> None:
        """``worker`` gets no new request (what it runs goes on); its queue stays at the broker."""
        worker.draining = True

    def stall(self, job: Job, out: Output, now: float) -> None:
        """``job`` made no progress on its worker: cancel it there and requeue it at the head; its
        worker gets no new request until one of those it still runs finishes (or, if it runs
        none, until it replies at all: ``replied``)."""
        worker = self._workers[job.worker]
        out.append((worker.identity, Cancel(job.request_id)))
        worker.inflight.discard(job.request_id)
        worker.cap = len(worker.inflight)
        self._requeue(job, now, out, lost=True)
        self._dispatch(job.model, out)

    def replied(self, worker: RegisteredWorker, out: Output) -> None:
        """A reply from ``worker`` (even for a request it no longer runs): its loop runs, so one a
        stall left drawing nothing takes one request again (its FINALs raise that); else it
        would get none for good."""
        if not worker.cap:
            worker.cap = 1
            for model in worker.info.models:
                self._dispatch(model, out)

    def finished_on(self, worker: RegisteredWorker, job: Job, answer: str) -> None:
        """``job`` ended well on ``worker`` with ``answer``: it may take one more at once again,
        and it now holds the conversation with the answer too (a chat's next turn)."""
        worker.cap = min(worker.cap + 1, worker.info.slots)
        if self.prefix_routing:
            r = job.request
            worker.prefixes.remember(after_answer(r.model, r.prompt, r.messages, answer, job.route).keys)

    def report(self, worker: RegisteredWorker, held: tuple[bytes, ...], msg: Heartbeat) -> None:
        """``worker``'s HEARTBEAT: ``held`` (its checked ``msg.held``) and its counters."""
        worker.prefixes.report(held, msg.prompt_tokens, msg.cached_prompt_tokens)

    def orphaned(self, job: Job) -> errors.RequestError:
        """The error for a request whose model no worker serves (any more)."""
        served = self.served()
        if not job.model:
            return errors.InvalidRequestError(f"name a model: this broker serves {served or 'none'}")
        if job.attempts:
            return errors.WorkerLostError(f"the workers serving {job.model!r} are gone; served: {served}")
        return errors.ModelNotFoundError(f"no worker serves model {job.model!r}; served: {served}")

    # -- inside ---------------------------------------------------------------------------------

    def _requeue(self, job: Job, now: float, out: Output, *, lost: bool) -> None:
        job.worker = None
        if not lost:
            job.attempts -= 1  # handed back on purpose: not a failed attempt
        if job.attempts >= self.max_attempts:
            self.counters.failed += 1
            out.append((job.client, Error(job.request_id, errors.WorkerLostError.code, _lost(job))))
            del self._jobs[job.request_id]
            return
        self.counters.requeued += 1
        job.waiting_since = now
        self._queues.setdefault(job.model, deque()).appendleft(job.request_id)

    def _adopt_unnamed(self) -> None:
        """Requests that named no model while none was served go to the only one served now."""
        only = self.only_model()
        unnamed = self._queues.get("")
        if not unnamed or only is None:
            return
        target = self._queues.setdefault(only, deque())
        for rid in unnamed:
            job = self._jobs[rid]
            if job.route.keys:  # the keys start from the model's name
                r = job.request
                job.route = route_keys(only, r.prompt, r.messages)
            job.request = dataclasses.replace(job.request, model=only, route_keys=list(job.route.keys))
            target.append(rid)
        unnamed.clear()

    def _choose(self, model: str, job: Job) -> RegisteredWorker | None:
        """The worker ``job`` goes to now (see the module docstring), or None: none is free."""
        free = [w for w in self._by_model.get(model, ()) if _takes_more(w)]
        if not free:
            return None
        least = min(free, key=_busy)
        if not (self.prefix_routing and job.route.keys):
            return least
        near = [w for w in free if _busy(w) <= _busy(least) + AFFINITY_SLACK]
        best = max(near, key=lambda w: (self.host_tiers.score(w, job.route), -_busy(w)))
        if self.host_tiers.score(best, job.route) == 0:
            self.counters.prefix_misses += 1
            return least
        self.counters.prefix_hits += 1
        return best

    def _dispatch(self, model: str, out: Output) -> None:
        queue = self._queues.get(model)
        while queue:
            worker = self._choose(model, self._jobs[queue[0]])
            if worker is None:
                return
            job = self._jobs[queue.popleft()]
            if self.prefix_routing:
                worker.prefixes.remember(job.route.keys)
                self.host_tiers.dispatched(worker, job.route.keys)
            job.worker = worker.identity
            job.progress_at = None
            job.attempts += 1
            worker.inflight.add(job.request_id)
            self.counters.dispatched += 1
            out.append((worker.identity, job.request))
