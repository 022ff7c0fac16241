"""Messages and a router for the tests of the broker's routing core (time is a number there)."""

from __future__ import annotations

from ovpool.broker.router import Router
from ovpool.protocol import Ready, Submit

C1, C2, W1, W2 = b"client-1", b"client-2", b"worker-1", b"worker-2"
LATE = 1000.0  # well past the broker's start-up grace


def ready(slots=2, models=("m",), worker_id="w", **fields):
    return Ready(worker_id, list(models), "CPU", slots, "host", 1, **fields)


def submit(rid, model="m", timeout_s=0.0, window=0, **params):
    return Submit(rid, model, {"max_tokens": 4, **params}, prompt="hi", timeout_s=timeout_s, window=window)


def of(out, cls):
    """The (peer, message) pairs of ``out`` whose message is a ``cls``."""
    return [(peer, m) for peer, m in out if isinstance(m, cls)]


def one_worker_router() -> Router:
    """A router past its grace with one worker W1 (2 slots, model "m"): queue_limit 2,
    max_new_tokens 100 (``router = pytest.fixture(one_worker_router, name="router")``)."""
    r = Router(now=0.0, queue_limit=2, max_new_tokens=100)
    r.handle(W1, ready(), LATE)
    return r
