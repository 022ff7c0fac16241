"""What the broker keeps of a worker's or supervisor's report (READY, LOAD_FAILED, SUPERVISED), as
pure checks: every limit on what one peer may make the broker hold, in one place.

The server bounds a whole message by protocol.MAX_MESSAGE_BYTES, protocol.decode checks each
top-level field's type, and a SUBMIT's fields are checked against ovpool.bounds at admission;
these limits bound the rest, so that no message, and no number of them from one peer, grows the
broker's state past a fixed size: a worker fills at most MAX_SLOTS slots whatever it advertises
(so a fake one cannot draw nearly all traffic by claiming 10**9), at most MAX_WORKERS register,
each names at most MAX_NAMES models.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ovpool import bounds
from ovpool.errors import InvalidRequestError
from ovpool.protocol import LoadFailed, Ready, Supervised

MAX_SLOTS = bounds.MAX_SLOTS  # slots the broker fills on one worker, whatever its READY advertises
MAX_WORKERS = 1024  # workers registered at once; a READY beyond is dropped
MAX_NAMES = 64  # model names (aliases included) in one READY or LOAD_FAILED
MAX_REASON_CHARS = 1000  # of a LOAD_FAILED's message, as the broker repeats it in errors
MAX_REPORT_SIZE = 64 << 10  # one SUPERVISED report's workers, or one READY's load map (bounds.json_value)

_FLAT = frozenset({str, int, float, bool, type(None)})


def is_name(value: Any, *, empty: bool = False) -> bool:
    """A model name, worker id, host or device the broker keeps: a string of 1 (0 if ``empty``)
    to bounds.MAX_NAME_CHARS characters."""
    return type(value) is str and (empty or value != "") and len(value) <= bounds.MAX_NAME_CHARS


def fit_ready(msg: Ready) -> Ready | None:
    """The READY the broker registers (its models without repeats, at most MAX_SLOTS slots), or
    None for one it drops: no slots, no models, names or a load map over the limits."""
    models = _names(msg.models)
    if (models is None or msg.slots < 1 or not is_name(msg.worker_id) or not is_name(msg.host, empty=True)
            or not is_name(msg.device, empty=True) or not _json(msg.load)):
        return None
    if models == msg.models and msg.slots <= MAX_SLOTS:
        return msg
    return dataclasses.replace(msg, models=models, slots=min(msg.slots, MAX_SLOTS))


def fit_load_failed(msg: LoadFailed) -> LoadFailed | None:
    """The LOAD_FAILED the broker keeps (its message cut to MAX_REASON_CHARS), or None."""
    models = _names(msg.models)
    names = (msg.worker_id, msg.host, msg.device, msg.code)
    if models is None or not all(is_name(v, empty=True) for v in names):
        return None
    return dataclasses.replace(msg, models=models, message=msg.message[:MAX_REASON_CHARS])


def fit_supervised(msg: Supervised) -> bool:
    """Whether the broker keeps this report: a host name and flat maps of text and numbers (STATUS
    lists them and metrics count their states, so every value must be hashable)."""
    return (is_name(msg.host, empty=True) and _json(msg.workers)
            and all(type(w) is dict and all(type(v) in _FLAT for v in w.values()) for w in msg.workers))


def _names(values: list) -> list[str] | None:
    """``values`` without repeats if they are 1..MAX_NAMES names, else None."""
    if 0 < len(values) <= MAX_NAMES and all(is_name(v) for v in values):
        return list(dict.fromkeys(values))
    return None


def _json(value: Any) -> bool:
    try:
        bounds.json_value(value, "report", MAX_REPORT_SIZE)
    except InvalidRequestError:
        return False
    return True
