"""The wire forms of the records messages carry: route keys, Deltas, Completions, load reports
and SamplingParams, each checked where it comes from an untrusted peer.
"""

from __future__ import annotations

from typing import Any

from ovpool.completion import Completion, Delta, TokenLogprobs
from ovpool.errors import MalformedMessageError
from ovpool.prefix_key import KEY_BYTES
from ovpool.protocol.messages import HELD_KEYS_MAX, Partial
from ovpool.sampling_params import SamplingParams
from ovpool.tools import ToolCallDelta


def route_keys_from_wire(keys: list, limit: int = HELD_KEYS_MAX) -> tuple[bytes, ...]:
    """REQUEST's ``route_keys`` or HEARTBEAT's ``held``: the first ``limit`` keys; raises
    MalformedMessageError unless each is a bytes string of prefix_key.KEY_BYTES."""
    keys = keys[:limit]
    if not all(type(k) is bytes and len(k) == KEY_BYTES for k in keys):
        raise MalformedMessageError(f"route keys must be {KEY_BYTES}-byte strings")
    return tuple(keys)


def partial_of(request_id: str, delta: Delta, seq: int) -> Partial:
    """A worker's PARTIAL for ``delta``."""
    return Partial(request_id, delta.index, delta.token_id, delta.text, seq,
                   [t.to_wire() for t in delta.logprobs], [c.to_wire() for c in delta.tool_calls])


def delta_of(msg: Partial) -> Delta:
    """The Delta of a PARTIAL from an untrusted peer; raises MalformedMessageError."""
    return Delta(msg.index, msg.token_id, msg.text,
                 TokenLogprobs.list_from_wire(msg.logprobs, "PARTIAL.logprobs"),
                 ToolCallDelta.list_from_wire(msg.tool_calls, "PARTIAL.tool_calls"))


def completion_to_wire(c: Completion) -> dict[str, Any]:
    """A FINAL's ``completion`` map."""
    return c.to_dict()


def load_to_wire(report: dict | None) -> dict[str, Any]:
    """``Engine.load_report`` as READY's ``load``: {outcome (hit, wrote, compiled...), seconds (all
    load phases together), entry (the cache entry or None), batching (whether the worker batches
    and how it gets that graph, in words; None if it does not say), chat (whether the model has a
    chat template: false for a completion-only base model; None if the worker does not say, which
    the HTTP API takes as chat), graph (the graph settings as the worker resolved them, every
    ``auto`` replaced: ``ovpool status`` shows them; None if it does not say), kv_tier (true, or
    absent: whether it reads and writes its host's KV tier, broker/host_tiers.py)}; {} for a
    backend without a model."""
    if not report:
        return {}
    phases = report.get("seconds") or {}
    seconds = sum(phases.values()) if isinstance(phases, dict) else float(phases)
    return {"outcome": report["outcome"], "seconds": round(seconds, 3), "entry": report.get("entry"),
            "batching": report.get("batching"), "chat": report.get("chat"),
            "graph": report.get("graph_settings"), **({"kv_tier": True} if report.get("kv_tier") else {})}


def sampling_to_wire(params: SamplingParams) -> dict[str, Any]:
    """SamplingParams as a SUBMIT/REQUEST ``params`` map: the fields not at their defaults (a
    third of the bytes each process packs or unpacks for a plain request)."""
    return params.to_dict(changed=True)


def sampling_from_wire(params: dict) -> SamplingParams:
    """Validated sampling parameters from a SUBMIT/REQUEST; bad values raise InvalidRequestError."""
    return SamplingParams.from_dict(params)
