"""What the broker drains (protocol.Drain), as pure logic: the pool's deadline, which workers a
name means, and the errors a draining pool answers with.

A pool drain refuses every new SUBMIT at once with DrainingError (retryable: the HTTP API makes it
503 + Retry-After) and lets what it accepted run on, queued requests included, until its
deadline; then what is left fails with DrainingError too, never silently. A worker drain only
takes those workers out of placement (RegisteredWorker.draining): their supervisor stops them once
they are idle, and whatever they still run then is handed back like a lost worker's, so it moves to
another worker exactly once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ovpool import errors
from ovpool.broker.state import RegisteredWorker


@dataclass
class PoolDrain:
    """The whole pool drains: started at ``since``, what is unfinished at ``deadline`` fails."""

    since: float
    deadline: float
    expired: bool = False

    def refusal(self, request_id: str) -> errors.DrainingError:
        return errors.DrainingError(f"request {request_id}: this pool is draining (shutting down or "
                                    "restarting) and accepts no new request; retry in a moment or "
                                    "send it to another replica")

    def timed_out(self, request_id: str) -> errors.DrainingError:
        return errors.DrainingError(
            f"request {request_id} was unfinished when the drain's timeout of "
            f"{self.deadline - self.since:g} s ended (setting shutdown_timeout_s): the pool stopped "
            "before it finished; send it again after the restart or to another replica")

    def describe(self, now: float) -> dict:
        return {"since_s": round(now - self.since, 3), "deadline_in_s": round(self.deadline - now, 3)}


def named(workers: Iterable[RegisteredWorker], name: str) -> list[RegisteredWorker]:
    """The workers ``name`` means: a worker id (``name@host:pid``), ``name@host`` or ``name``."""
    return [w for w in workers if w.info.worker_id == name
            or w.info.worker_id.startswith(name + ("@" if "@" not in name else ":"))]


def start(current: PoolDrain | None, now: float, timeout_s: float) -> PoolDrain:
    """The pool's drain after a DRAIN of ``timeout_s``: a second one may bring the deadline nearer,
    never push it back (a user's `ovpool drain --timeout 0` ends a long drain now)."""
    timeout_s = 0.0 if math.isnan(timeout_s) else max(0.0, timeout_s)  # a peer's NaN: now
    if current is None:
        return PoolDrain(now, now + timeout_s)
    current.deadline = min(current.deadline, now + timeout_s)
    return current
