"""Which SUBMITs the broker accepts, as pure logic: a valid request becomes a Job, anything else a
RequestError naming what is wrong (the Router answers it as ERROR).

A SUBMIT is refused if its id is not 1..128 characters, it has both or neither of prompt and
messages, its chat messages are not role/content strings, its sampling parameters are invalid or
ask for more than ``max_new_tokens``, it names a model no worker serves (after the start-up grace
a restarted broker gives workers to register again, or at once when a worker that was to serve it
reported that it cannot load it: LOAD_FAILED), or its model's queue is full.
"""

from __future__ import annotations

import secrets

from ovpool import errors, timing
from ovpool.broker.placement import Placement
from ovpool.broker.state import Job, LoadFailures
from ovpool.prefix_key import NO_KEYS, route_keys
from ovpool.protocol import Request, Submit, sampling_from_wire

_MAX_ID_LEN = 128


class Admission:
    def __init__(self, placement: Placement, failures: LoadFailures, *, started: float, queue_limit: int,
                 max_new_tokens: int):
        self.placement = placement  # its prefix_routing: whether requests get route keys
        self.failures = failures
        self.started = started
        self.queue_limit = queue_limit
        self.max_new_tokens = max_new_tokens

    def admit(self, peer: bytes, msg: Submit, now: float) -> Job:
        """The Job for ``msg`` from ``peer``; raises a RequestError if it is refused."""
        if not msg.request_id or len(msg.request_id) > _MAX_ID_LEN:
            raise errors.InvalidRequestError(f"request_id must be 1..{_MAX_ID_LEN} characters")
        if (msg.prompt is None) == (msg.messages is None):
            raise errors.InvalidRequestError("give exactly one of prompt or messages")
        if msg.messages is not None and not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in msg.messages):
            raise errors.InvalidRequestError('messages must be maps with string "role" and "content"')
        params = sampling_from_wire(msg.params)
        if params.max_tokens > self.max_new_tokens:
            raise errors.InvalidRequestError(
                f"max_tokens={params.max_tokens} exceeds this broker's limit of {self.max_new_tokens}"
                " (setting max_new_tokens)")
        model = self._resolve_model(msg.model, now)
        if self.placement.queued(model) >= self.queue_limit and not self.placement.has_free_slot(model):
            raise errors.QueueFullError(
                f"model {model!r} has {self.queue_limit} requests queued (queue_limit); retry later")
        wire = msg.params  # validated above, so it is forwarded as it came
        if params.seed is None:  # a fixed seed makes a re-dispatch replay the same tokens
            wire = {**wire, "seed": secrets.randbits(63)}
        route = route_keys(model, msg.prompt, msg.messages) if self.placement.prefix_routing else NO_KEYS
        request = Request(msg.request_id, model, wire, msg.prompt, msg.messages, list(route.keys))
        deadline = now + msg.timeout_s if msg.timeout_s > 0 else float("inf")
        return Job(request, peer, deadline, queued_at=now, waiting_since=now, route=route)

    def _resolve_model(self, model: str, now: float) -> str:
        resolved = (model if self.placement.serves(model) else None) if model else self.placement.only_model()
        if resolved is not None:  # the common cases, without building the served list per request
            return resolved
        served = self.placement.served()
        if (model or not served) and self.failures.explain(model):
            raise self.not_served(model)  # a worker that cannot load it: no use waiting for it
        starting = now < self.started + timing.BROKER_GRACE_S
        if not model:
            if not served and starting:
                return ""  # the only model is decided when the first worker registers
            raise errors.InvalidRequestError(
                f"name a model: this broker serves {served or 'none yet'}")
        if not starting:
            raise self.not_served(model)
        return model

    def not_served(self, model: str) -> errors.ModelNotFoundError:
        """The error for a request for ``model`` ("": any) that no worker serves, with the load
        failures of workers that were to serve it."""
        failed = self.failures.explain(model)
        what = f"model {model!r}" if model else "any model yet"
        return errors.ModelNotFoundError(f"no worker serves {what}: {failed}" if failed else
                                         f"no worker serves {what}; served: {self.placement.served()}")
