"""The broker's queues and slots: which request waits where and which worker runs it.

Router (the protocol) drives this state; it holds every invariant about placement:

- a request is either queued (in its model's FIFO) or in flight on exactly one worker;
- a worker's ``inflight`` never exceeds its slots; the least-loaded worker (by busy fraction) gets
  the next request;
- a lost worker's requests go back to the head of their queue, at most ``max_attempts``
  dispatches per request, then WorkerLost.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from ovpool import errors
from ovpool.broker.state import Counters, Job, WorkerState
from ovpool.protocol import Cancel, Error, Message

Output = list[tuple[bytes, Message]]


class Scheduler:
    def __init__(self, *, now: float, max_attempts: int):
        self.started = now
        self.max_attempts = max_attempts
        self.workers: dict[bytes, WorkerState] = {}
        self.jobs: dict[str, Job] = {}
        self.queues: dict[str, deque[str]] = {}
        self.counters = Counters()
        self._by_model: dict[str, list[WorkerState]] = {}

    def _add_worker(self, worker: WorkerState, out: Output) -> None:
        self.workers[worker.identity] = worker
        for model in worker.info.models:
            self._by_model.setdefault(model, []).append(worker)
        self._adopt_unnamed()
        for model in worker.info.models:
            self._dispatch(model, out)

    def _adopt_unnamed(self) -> None:
        """Requests that named no model while none was served go to the only one served now."""
        only = self._only_model()
        unnamed = self.queues.get("")
        if not unnamed or only is None:
            return
        target = self.queues.setdefault(only, deque())
        for rid in unnamed:
            job = self.jobs[rid]
            job.request = dataclasses.replace(job.request, model=only)
            target.append(rid)
        unnamed.clear()

    def _only_model(self) -> str | None:
        """The model every worker serves first (its other names are aliases), if there is one."""
        primaries = {w.info.models[0] for w in self.workers.values()}
        return primaries.pop() if len(primaries) == 1 else None

    def _free_worker(self, model: str) -> WorkerState | None:
        best = None
        for w in self._by_model.get(model, ()):
            if len(w.inflight) < w.info.slots and (
                    best is None or len(w.inflight) * best.info.slots < len(best.inflight) * w.info.slots):
                best = w
        return best

    def _dispatch(self, model: str, out: Output) -> None:
        queue = self.queues.get(model)
        while queue:
            worker = self._free_worker(model)
            if worker is None:
                return
            job = self.jobs[queue.popleft()]
            job.worker = worker.identity
            job.attempts += 1
            worker.inflight.add(job.request_id)
            self.counters.dispatched += 1
            out.append((worker.identity, job.request))

    def _finish(self, job: Job, out: Output) -> None:
        """Forget ``job`` and free its slot or queue place."""
        del self.jobs[job.request_id]
        worker = self.workers.get(job.worker) if job.worker is not None else None
        if worker is None:
            self.queues[job.model].remove(job.request_id)
            return
        worker.inflight.discard(job.request_id)
        for model in worker.info.models:
            self._dispatch(model, out)

    def _fail(self, job: Job, exc: errors.OvpoolError, out: Output) -> None:
        if job.worker is not None:
            out.append((job.worker, Cancel(job.request_id)))
        out.append((job.client, Error(job.request_id, exc.code, str(exc))))
        self._finish(job, out)

    def _drop_worker(self, worker: WorkerState, now: float, out: Output, *, lost: bool) -> None:
        del self.workers[worker.identity]
        for model in worker.info.models:
            self._by_model[model].remove(worker)
        for rid in sorted(worker.inflight, key=lambda r: self.jobs[r].queued_at, reverse=True):
            job = self.jobs[rid]
            job.worker = None
            if not lost:
                job.attempts -= 1  # handed back on purpose: not a failed attempt
            if job.attempts >= self.max_attempts:
                self.counters.failed += 1
                out.append((job.client, Error(rid, errors.WorkerLostError.code,
                                              f"request lost its worker {job.attempts} times")))
                del self.jobs[rid]
                continue
            self.counters.requeued += 1
            job.waiting_since = now
            self.queues[job.model].appendleft(rid)
        for model in worker.info.models:
            self._dispatch(model, out)

    def _orphaned(self, job: Job) -> errors.RequestError:
        served = sorted(m for m, ws in self._by_model.items() if ws)
        if not job.model:
            return errors.InvalidRequestError(f"name a model: this broker serves {served or 'none'}")
        if job.attempts:
            return errors.WorkerLostError(f"the workers serving {job.model!r} are gone; served: {served}")
        return errors.ModelNotFoundError(f"no worker serves model {job.model!r}; served: {served}")

    def status(self, now: float) -> dict:
        return {
            "uptime_s": round(now - self.started, 3),
            "workers": [w.describe(now) for w in self.workers.values()],
            "queues": {m: len(q) for m, q in self.queues.items()},
            "in_flight": sum(len(w.inflight) for w in self.workers.values()),
            "counters": self.counters.as_dict(),
        }
