"""A client's SUBMIT, built and checked before it is tracked or sent (ovpool.pending tracks it).

Its sampling seed is fixed here, so a resend after a broker restart or a failover replays the
same tokens; bad parameters, a prompt over ovpool.bounds, what msgpack cannot encode, or a message
over the broker's limit are an InvalidRequestError naming the field, never a SUBMIT.
"""

from __future__ import annotations

import itertools
import random
import uuid
from typing import Any

import msgpack

from ovpool import bounds, errors, keep_alive, tools
from ovpool.protocol import MAX_MESSAGE_BYTES, Submit, encode, sampling_to_wire
from ovpool.sampling_params import SamplingParams

_seeds = random.Random()  # sampling seeds need no cryptographic strength


def make_submit(prompt_or_messages: str | list, model: str, timeout: float | None,
                sampling: dict[str, Any], window: int = 0, params: SamplingParams | None = None) -> Submit:
    """A validated SUBMIT (``window`` > 0: a stream with that much credit). Bad sampling parameters,
    a prompt over ovpool.bounds, anything msgpack cannot encode, or a message over the broker's
    limit raise InvalidRequestError naming the field here, before it is tracked or sent.
    ``sampling`` may hold ``keep_alive`` (ovpool.keep_alive), which is the SUBMIT's, not sampling;
    ``params``: SamplingParams the caller built (so checked) instead of the rest of ``sampling``."""
    sampling = dict(sampling)
    keep_alive_s = keep_alive.parse(sampling.pop("keep_alive", None))
    checked = _sampling(sampling, params)
    tools.check_chat(checked.calls_tools, not isinstance(prompt_or_messages, str))
    params = sampling_to_wire(checked)
    if params.get("seed") is None:  # fixed here so that a resend replays the same tokens
        params["seed"] = _seeds.getrandbits(63)
    if isinstance(prompt_or_messages, str):
        prompt, messages = bounds.prompt(prompt_or_messages), None
    elif isinstance(prompt_or_messages, list):
        prompt, messages = None, bounds.messages(prompt_or_messages)
    else:
        raise errors.InvalidRequestError(
            f"prompt must be a str or a list of chat messages, not {type(prompt_or_messages).__name__}",
            param="prompt")
    if timeout is not None and not 0 < timeout:  # NaN too
        raise errors.InvalidRequestError("timeout must be > 0 seconds (or None for no timeout)",
                                         param="timeout")
    model = bounds.text(model or "", "model", bounds.MAX_NAME_CHARS)
    submit = Submit(_next_id(), model, params, prompt, messages, float(timeout or 0.0), window, keep_alive_s)
    _check_size(submit)
    return submit


def _sampling(sampling: dict[str, Any], params: SamplingParams | None) -> SamplingParams:
    """``params`` as given (built, so checked, once: the HTTP API's parser does), else ``sampling``'s."""
    if params is None:
        return SamplingParams(**sampling)
    if type(params) is not SamplingParams:
        raise errors.InvalidRequestError(f"params must be a SamplingParams, not {type(params).__name__}",
                                         param="params")
    if sampling:
        raise errors.InvalidRequestError(
            f"sampling parameters {sorted(sampling)[:8]} beside params=SamplingParams(...): give one or"
            " the other", param="params")
    return params


def _check_size(submit: Submit) -> None:
    """InvalidRequestError if ``submit`` cannot be encoded, naming the field, or if it is over
    protocol.MAX_MESSAGE_BYTES (the broker would refuse it)."""
    try:
        size = len(encode(submit)[2])
    except (ValueError, TypeError, OverflowError) as exc:  # msgpack: surrogates, ints past 64 bits...
        field = next((name for name, value in submit.__dict__.items() if not _encodes(value)), None)
        raise errors.InvalidRequestError(f"{field}: cannot be sent ({exc})", param=field) from None
    if size > MAX_MESSAGE_BYTES:
        raise errors.InvalidRequestError(
            f"the request is {size:,} bytes encoded, over the broker's limit of {MAX_MESSAGE_BYTES:,}"
            f" bytes ({MAX_MESSAGE_BYTES >> 20} MiB) per message; send a shorter prompt")


def _encodes(value: Any) -> bool:
    try:
        msgpack.packb(value, use_bin_type=True)
    except (ValueError, TypeError, OverflowError):
        return False
    return True


# A random per-process prefix and a counter: unique ids without os.urandom per request.
_ID_PREFIX = uuid.uuid4().hex[:16]
_ID_COUNTER = itertools.count()


def _next_id() -> str:
    return f"{_ID_PREFIX}-{next(_ID_COUNTER)}"
