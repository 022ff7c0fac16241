"""Which SUBMITs the broker accepts, as pure logic: a valid request becomes a Job, anything else a
RequestError naming what is wrong (the Router answers it as ERROR).

A SUBMIT is refused if its id is not 1..128 characters, its timeout or window is negative or not
finite, it has both or neither of prompt and messages, its model name, prompt or chat messages
are outside ovpool.bounds (every field of a message too), its sampling parameters are invalid
(SamplingParams: nested ones included) or ask for more than ``max_new_tokens``, it names a model
no worker serves (after the start-up grace a restarted broker gives workers to register again,
or at once when a worker that was to serve it reported that it cannot load it: LOAD_FAILED; a
model a supervisor loads on demand, SUPERVISED entries with ``model``, waits for its load), its
model's queue is full, or its keep-alive is not a number of seconds (ovpool.keep_alive.seconds).
During the grace, requests wait for at most ``MAX_UNSEEN_MODELS`` models not served yet. The
whole message is within protocol.MAX_MESSAGE_BYTES (the server).
"""

from __future__ import annotations

import math
import secrets

from ovpool import bounds, errors, keep_alive, timing
from ovpool.broker.placement import Placement
from ovpool.broker.state import Job, LoadFailures, SupervisedHosts
from ovpool.prefix_key import NO_KEYS, route_keys
from ovpool.protocol import Request, Submit, sampling_from_wire
from ovpool.sampling_params import SamplingParams

_MAX_ID_LEN = 128
MAX_UNSEEN_MODELS = 16  # models not served yet that requests may wait for in the start-up grace


class Admission:
    def __init__(self, placement: Placement, failures: LoadFailures, *, started: float, queue_limit: int,
                 max_new_tokens: int, supervised: SupervisedHosts | None = None):
        self.placement = placement  # its prefix_routing: whether requests get route keys
        self.failures = failures
        self.supervised = supervised if supervised is not None else SupervisedHosts()  # on-demand models
        self.started = started
        self.queue_limit = queue_limit
        self.max_new_tokens = max_new_tokens

    def admit(self, peer: bytes, msg: Submit, now: float) -> Job:
        """The Job for ``msg`` from ``peer``; raises a RequestError if it is refused."""
        _check_envelope(msg)
        keep = None if msg.keep_alive_s is None else keep_alive.seconds(msg.keep_alive_s, "keep_alive_s")
        params = _sampling(msg.params)
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
        return Job(request, peer, deadline, queued_at=now, waiting_since=now, route=route,
                   max_tokens=params.max_tokens, keep_alive_s=keep)

    def _resolve_model(self, model: str, now: float) -> str:
        resolved = (model if self.placement.serves(model) else None) if model else self.placement.only_model()
        if resolved is not None:  # the common cases, without building the served list per request
            return resolved
        served = self.placement.served()
        if (model or not served) and self.failures.explain(model):
            raise self.not_served(model)  # a worker that cannot load it: no use waiting for it
        state, reason = self.supervised.residency(model) if model else ("", "")
        if state == "failed":
            raise cannot_load(model, reason)
        if state:
            return model  # not loaded now: it waits while its supervisor loads it
        starting = now < self.started + timing.BROKER_GRACE_S
        if not model:
            if not served and starting:
                return ""  # the only model is decided when the first worker registers
            raise errors.InvalidRequestError(
                f"name a model: this broker serves {served or 'none yet'}")
        if not starting:
            raise self.not_served(model)
        if self.placement.unseen_models() >= MAX_UNSEEN_MODELS and not self.placement.queued(model):
            raise errors.ModelNotFoundError(
                f"no worker serves model {model!r} yet, and requests already wait for"
                f" {MAX_UNSEEN_MODELS} models not served; retry once the workers registered")
        return model

    def not_served(self, model: str) -> errors.ModelNotFoundError:
        """The error for a request for ``model`` ("": any) that no worker serves, with the load
        failures of workers that were to serve it."""
        failed = self.failures.explain(model)
        what = f"model {model!r}" if model else "any model yet"
        return errors.ModelNotFoundError(f"no worker serves {what}: {failed}" if failed else
                                         f"no worker serves {what}; served: {self.placement.served()}")


def _check_envelope(msg: Submit) -> None:
    """The SUBMIT's own fields (protocol.decode checked their types), within ovpool.bounds."""
    if not msg.request_id or len(msg.request_id) > _MAX_ID_LEN:
        raise errors.InvalidRequestError(f"request_id must be 1..{_MAX_ID_LEN} characters")
    bounds.text(msg.model, "model", bounds.MAX_NAME_CHARS)
    if not (math.isfinite(msg.timeout_s) and msg.timeout_s >= 0):
        raise errors.InvalidRequestError("timeout_s must be a finite number of seconds >= 0 (0: none)",
                                         param="timeout_s")
    if msg.window < 0:
        raise errors.InvalidRequestError("window must be >= 0 tokens (0: no stream)", param="window")
    if (msg.prompt is None) == (msg.messages is None):
        raise errors.InvalidRequestError("give exactly one of prompt or messages")
    if msg.prompt is not None:
        bounds.prompt(msg.prompt)
        return
    bounds.messages(msg.messages)  # fields beyond role, content and name too: they reach the template


def _sampling(params: dict) -> SamplingParams:
    """SUBMIT's params, validated: InvalidRequestError naming the field for anything else."""
    try:
        return sampling_from_wire(params)
    except errors.OvpoolError:
        raise
    except Exception as exc:  # a validator below (llguidance, json) failing on input it never expected
        raise errors.InvalidRequestError(
            f"params: not valid sampling parameters ({type(exc).__name__}: {exc})"[:300],
            param="params") from None


def cannot_load(model: str, reason: str) -> errors.ModelNotFoundError:
    """The error of a request for a model its supervisor reported it could not load."""
    return errors.ModelNotFoundError(f"model {model!r} cannot be loaded: {reason}")
