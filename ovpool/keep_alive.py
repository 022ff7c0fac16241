"""A request's ``keep_alive``, as Ollama's API takes it: how long its model stays loaded once idle.

Ollama's forms: a number of seconds (``600``, ``0.5``), or a Go duration string (``"10m"``,
``"1h30m"``, ``"300ms"``, ``"0"``); ``0`` unloads the model right after the request, any negative
value (``-1``, ``"-1m"``) keeps it loaded for good. A string of a bare number (``"600"``) is taken
as seconds too (Go's parser refuses it; environment variables are often written so). ``None``: the
model's own keep-alive (setting ``keep_alive_s`` or its models-file entry). The last request for a
model decides (ovpool.broker.residency).

One parser for the HTTP API's bodies and the Client's keyword; the broker checks the number that
travels (SUBMIT.keep_alive_s) with ``seconds`` again, since a peer may send anything.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ovpool.bounds import describe
from ovpool.errors import InvalidRequestError

NEVER = -1.0
# About 31 years: a duration past this is a typo for "never" (-1), not a plan.
MAX_KEEP_ALIVE_S = 1e9
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)")
_MAX_CHARS = 64
_FORMS = 'a number of seconds or a duration such as "10m" or "1h30m"; 0: unload after the request; -1: never'


def parse(value: Any, param: str = "keep_alive") -> float | None:
    """``value`` in seconds (NEVER for any negative), None for None; a 400 naming ``param`` else."""
    if value is None:
        return None
    if type(value) in (int, float):
        return seconds(value, param)
    if type(value) is not str or len(value) > _MAX_CHARS:
        raise _bad(param, value)
    text = value.strip()
    if _NUMBER.fullmatch(text):
        return seconds(float(text), param)
    sign, body = (-1.0, text[1:]) if text[:1] == "-" else (1.0, text.lstrip("+"))
    parts = _PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise _bad(param, value)
    return seconds(sign * sum(float(n) * _UNITS[u] for n, u in parts), param)


def seconds(value: Any, param: str = "keep_alive") -> float:
    """A number of seconds as a keep-alive: finite, at most MAX_KEEP_ALIVE_S; negative: NEVER."""
    if type(value) not in (int, float) or value > MAX_KEEP_ALIVE_S \
            or (type(value) is float and not math.isfinite(value)):
        raise _bad(param, value)
    return NEVER if value < 0 else float(value)


def _bad(param: str, value: Any) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: must be {_FORMS} (at most {MAX_KEEP_ALIVE_S:g} s), got "
                               f"{describe(value)}", param=param)
