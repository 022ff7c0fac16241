"""``GET /v1/models`` and ``GET /v1/models/{id}`` from the broker's STATUS: pure functions.

Each model says what it can serve in ``capabilities``: ``completion`` always, and ``chat`` unless a
worker serving it reported that its model has no chat template (READY's ``load.chat`` false,
protocol.load_to_wire), or serve did for a model it loads on demand (its entries' ``chat`` 0): a
base model such as gemma3-270m takes prompts only, and its workers answer a chat request with a 400
that says so. A worker that does not say (the null backend, an older
worker) is taken to chat.

Each model has a ``state``: ``loaded`` when a worker serves it; a model `ovpool serve` loads on
demand (several models) may also be ``unloaded``, ``loading``, ``unloading`` or ``failed`` (with the
``reason``), from the entries serve reports to the broker (broker/residency.py).
"""

from __future__ import annotations

import time
from typing import Any

from ovpool.errors import InvalidRequestError, ModelNotFoundError


def listed(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The model objects, by id: each served or loadable name, its worker count, capabilities, state."""
    counts: dict[str, int] = {}
    templateless: set[str] = set()
    for worker in status["workers"]:
        load = worker.get("load")
        for name in worker["models"]:
            counts[name] = counts.get(name, 0) + 1
            if isinstance(load, dict) and load.get("chat") is False:
                templateless.add(name)
    templateless |= {e["model"] for e in status.get("supervised", []) if e.get("chat") == 0}  # unloaded
    created = int(time.time() - status["uptime_s"])
    states = _residency(status)
    return [{"id": name, "object": "model", "created": created, "owned_by": "ovpool",
             "workers": counts.get(name, 0),
             "capabilities": ["completion"] if name in templateless else ["chat", "completion"],
             **({"state": "loaded"} if counts.get(name) else states.get(name, {"state": "loaded"}))}
            for name in sorted(set(counts) | set(states))]


def ordered(status: dict[str, Any], model_id: str, action: str) -> dict[str, Any]:
    """The model object of a model a load or unload was asked for (the broker's status after
    the order); 404 when it does not exist, 400 when it is not one serve loads on demand or is
    pinned (it never unloads)."""
    model = one(status, model_id)
    entries = [e for e in status.get("supervised", []) if e.get("model") == model_id]
    if not entries:
        raise InvalidRequestError(f"model {model_id[:256]!r} is not loaded on demand (a pool of one "
                                  "model keeps it loaded): there is nothing to load or unload")
    if action == "unload" and any(e.get("pinned") for e in entries):
        raise InvalidRequestError(f"model {model_id[:256]!r} is pinned: it never unloads (unpin it "
                                  "in the models file)")
    return model


def _residency(status: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The models `ovpool serve` loads on demand (its SUPERVISED entries with ``residency``):
    name -> {"state": unloaded, loading, loaded, unloading or failed[, "reason": why it failed]}."""
    found: dict[str, dict[str, str]] = {}
    for entry in status.get("supervised", []):
        name, state = entry.get("model"), entry.get("residency")
        if isinstance(name, str) and isinstance(state, str) and found.get(name, {}).get("state") != "loaded":
            found[name] = {"state": state, **({"reason": entry.get("residency_reason", "")}
                                              if state == "failed" else {})}
    return found


def one(status: dict[str, Any], model_id: str) -> dict[str, Any]:
    """The model object of ``model_id``; ModelNotFoundError (404) when no worker serves it."""
    for model in listed(status):
        if model["id"] == model_id:
            return model
    raise ModelNotFoundError(f"the model {model_id[:256]!r} does not exist here; GET /v1/models lists "
                             "the models served")
