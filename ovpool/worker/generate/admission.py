"""Admission off the batched step: a request whose prompt is long or that has a response_format
is admitted on a thread of its own (tokenization, limits, the constraint's build), so that the
other requests' steps never wait for it. The batcher takes the finished ones between steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from ovpool.errors import InferenceError, OvpoolError
from ovpool.worker.generate.constraint import BUDGET_S, Constraint, Vocabulary, too_complex

Prepared = tuple[list[int], Constraint | None]  # a request's checked token ids and its constraint


class Preparer:
    """Requests admitted on a thread of their own, so that the batched step never waits for a
    long prompt's tokenization or a constraint's build: ``submit`` a request, ``take`` the
    finished ones (its token ids and Constraint, or the OvpoolError that fails it). A build still
    running BUDGET_S after it started fails its request at once; the thread finishes it
    (llguidance cannot be interrupted; its limits bound how long)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="admission")
        self._jobs: dict[str, tuple[Future, list[float], str]] = {}
        self._fresh: list[Future] = []  # submitted since the last take

    def __len__(self) -> int:
        return len(self._jobs)

    def submit(self, request_id: str, admit: Callable[[], list[int]], vocabulary: Callable[[], Vocabulary],
               fmt: dict | None, ignore_eos: bool, param: str = "response_format") -> None:
        """``admit`` (the prompt's checked ids) and ``vocabulary`` (the model's, built on first
        use) are not part of the budget; ``param`` is the field ``fmt`` came from, for errors."""
        started: list[float] = []

        def prepare() -> tuple[list[int], Constraint | None]:
            ids = admit()
            if fmt is None:
                return ids, None
            vocab = vocabulary()
            started.append(time.monotonic())
            return ids, vocab.constraint(fmt, ignore_eos, param)

        future = self._pool.submit(prepare)
        self._jobs[request_id] = (future, started, param)
        self._fresh.append(future)

    def cancel(self, request_id: str) -> None:
        self._jobs.pop(request_id, None)

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` for a build to end (a step with nothing else to do)."""
        if self._jobs:
            wait([job[0] for job in self._jobs.values()], timeout, return_when="FIRST_COMPLETED")

    def take(self, fresh_s: float = 0.0) -> list[tuple[str, Prepared | OvpoolError]]:
        """The finished requests, after waiting up to ``fresh_s`` for those submitted since the
        last take: a chat's long but already-tokenized history is ready in about a millisecond, and
        taking it now saves it a whole step."""
        if self._fresh and fresh_s > 0:
            wait(self._fresh, fresh_s)
        self._fresh = []
        now, out = time.monotonic(), []
        for rid, (future, started, param) in list(self._jobs.items()):
            if future.done():
                out.append((rid, _outcome(future)))
            elif started and now - started[0] > BUDGET_S:
                out.append((rid, too_complex(f"building it took more than {BUDGET_S} s", param)))
            else:
                continue
            del self._jobs[rid]
        return out


def _outcome(future: Future) -> tuple[list[int], Constraint | None] | OvpoolError:
    exc = future.exception()
    if exc is None:
        return future.result()
    if isinstance(exc, OvpoolError):
        return exc
    return InferenceError(f"cannot start a generation: {exc}")
