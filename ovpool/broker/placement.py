"""The broker's queues and slots: which request waits where and which worker runs it.

Router (the protocol) owns one Placement and changes placement state only through its methods;
Placement holds every invariant about it:

- a request is either queued (in its model's FIFO) or in flight on exactly one worker;
- a worker's ``inflight`` never exceeds its slots nor the broker's cap on them
  (RegisteredWorker.cap); the least-loaded worker (by busy fraction) gets the next request;
- a lost worker's requests, and one that stalled (``stall``), go back to the head of their queue,
  at most ``max_attempts`` dispatches per request, then WorkerLost.

``workers``, ``jobs`` and ``queues`` are read-only views for the Router; a Job's ``client``,
``next_seq`` and ``progress_at`` are the Router's (which peer hears the stream, how far, and when
it last moved; dispatch resets ``progress_at`` to None), the rest is placement's.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from types import MappingProxyType

from ovpool import errors
from ovpool.broker.state import Counters, Job, Output, RegisteredWorker
from ovpool.protocol import Cancel, Error


class Placement:
    def __init__(self, *, max_attempts: int, counters: Counters):
        self.max_attempts = max_attempts
        self.counters = counters
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

    def has_free_slot(self, model: str) -> bool:
        return self._free_worker(model) is not None

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
            self._queues[job.model].remove(job.request_id)
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
        for rid in sorted(worker.inflight, key=lambda r: self._jobs[r].queued_at, reverse=True):
            self._requeue(self._jobs[rid], now, out, lost=lost)
        for model in worker.info.models:
            self._dispatch(model, out)

    def stall(self, job: Job, out: Output, now: float) -> None:
        """``job`` made no progress on its worker: cancel it there and requeue it at the head; its
        worker gets no new request until one of those it still runs finishes."""
        worker = self._workers[job.worker]
        out.append((worker.identity, Cancel(job.request_id)))
        worker.inflight.discard(job.request_id)
        worker.cap = len(worker.inflight)
        self._requeue(job, now, out, lost=True)
        self._dispatch(job.model, out)

    def finished_on(self, worker: RegisteredWorker) -> None:
        """A request ended well on ``worker``: it may take one more at once again."""
        worker.cap = min(worker.cap + 1, worker.info.slots)

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
            out.append((job.client, Error(job.request_id, errors.WorkerLostError.code,
                                          f"request lost its worker {job.attempts} times")))
            del self._jobs[job.request_id]
            return
        self.counters.requeued += 1
        job.waiting_since = now
        self._queues[job.model].appendleft(job.request_id)

    def _adopt_unnamed(self) -> None:
        """Requests that named no model while none was served go to the only one served now."""
        only = self.only_model()
        unnamed = self._queues.get("")
        if not unnamed or only is None:
            return
        target = self._queues.setdefault(only, deque())
        for rid in unnamed:
            job = self._jobs[rid]
            job.request = dataclasses.replace(job.request, model=only)
            target.append(rid)
        unnamed.clear()

    def _free_worker(self, model: str) -> RegisteredWorker | None:
        best = None
        for w in self._by_model.get(model, ()):
            if len(w.inflight) < w.cap and (
                    best is None or len(w.inflight) * best.info.slots < len(best.inflight) * w.info.slots):
                best = w
        return best

    def _dispatch(self, model: str, out: Output) -> None:
        queue = self._queues.get(model)
        while queue:
            worker = self._free_worker(model)
            if worker is None:
                return
            job = self._jobs[queue.popleft()]
            job.worker = worker.identity
            job.progress_at = None
            job.attempts += 1
            worker.inflight.add(job.request_id)
            self.counters.dispatched += 1
            out.append((worker.identity, job.request))
