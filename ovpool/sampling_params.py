"""Sampling parameters as they travel on the wire: plain data, validated, no NumPy (the client and
the protocol import this; the worker's sampler reads it)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ovpool import bounds
from ovpool import response_format as formats
from ovpool import tools as tooling
from ovpool.bounds import MAX_LOGIT_BIAS, MAX_LOGPROBS, MAX_PENALTY, MAX_TEMPERATURE
from ovpool.errors import InvalidRequestError

_NUM, _INT = (float, int), (int,)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` is greedy; the same seed gives the same tokens.

    One position's float32 logits go through, in this order (vLLM's for steps 0-3):

    0. with a ``response_format``, every token it forbids goes to -inf (docs/structured-output.md);
    1. ``logit_bias`` {token id: bias in [-100, 100]} is added;
    2. ``repetition_penalty`` (Hugging Face / vLLM): every token of the prompt or of the output
       so far has a positive logit divided by it, a negative one multiplied (1 is off);
    3. ``frequency_penalty`` times the token's count in the output, and ``presence_penalty``
       once if it occurs there, are subtracted (OpenAI's formula; 0 is off);
    4. greedy takes the argmax; otherwise divide by ``temperature``, keep the ``top_k`` most
       probable, then the smallest prefix of them holding ``top_p`` of their mass, then those
       whose probability is at least ``min_p`` times the most probable one's (Hugging Face's
       order; vLLM applies min_p before top_k and top_p), and draw from the seeded generator.
       Ties are broken by the lower token id.

    ``logprobs`` None returns none; N (0..20; True means 0) returns, for every output token, its
    log-probability and the N most probable tokens' (with their ids and text). They are of the
    model's raw logits, log-softmax at float32 before bias, penalties and temperature: vLLM's
    default (``logprobs_mode="raw_logprobs"``).
    """

    max_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0          # 0: no top-k filter
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # ((token id, bias), ...) sorted by id; give a mapping {id: bias} (ids as ints or digit strings).
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    logprobs: int | None = None
    # What the output must match: a JSON schema, any JSON object, a regex or a grammar, masked
    # before step 4 (ovpool.response_format, docs/structured-output.md); None: free text.
    response_format: dict | None = None
    # Functions the model may call (ovpool.tools, docs/tools.md): canonical tools, tool_choice
    # ("none", "auto", "required" or {"name": ...}; None without tools), and whether a reply may
    # hold more than one call. A call's name and arguments are held to the declared ones.
    tools: list | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True

    def __post_init__(self) -> None:
        d = self.__dict__  # frozen: normalize in place, once
        if isinstance(d["stop"], str | list):
            d["stop"] = (d["stop"],) if isinstance(d["stop"], str) else tuple(d["stop"])
        if type(d["logprobs"]) is bool:
            d["logprobs"] = 0 if d["logprobs"] else None
        if d["logit_bias"] or isinstance(d["logit_bias"], dict | list):
            d["logit_bias"] = _logit_bias(d["logit_bias"])
        for check in _CHECKS:
            _check(check, d[check[0]])
        bounds.logprob_entries(1, d["max_tokens"], d["logprobs"])
        d["response_format"] = formats.normalize(d["response_format"])
        d["tools"] = tooling.normalize_tools(d["tools"])
        d["tool_choice"] = tooling.normalize_choice(d["tool_choice"], d["tools"])
        tooling.check_with_format(d["tools"], d["tool_choice"], d["response_format"])

    def with_seed(self, seed: int | None) -> SamplingParams:
        """These parameters with another ``seed``; only the seed is checked (the rest was when
        these were built): n choices of one HTTP request are built once, not n times."""
        _check(_SEED_CHECK, seed)
        out = _new(type(self))  # frozen: filled as __init__ would, without copy.copy's reduce protocol
        out.__dict__.update(self.__dict__, seed=seed)
        return out

    @property
    def calls_tools(self) -> bool:
        """Whether the reply may hold tool calls (tools given, tool_choice not "none")."""
        return self.tools is not None and self.tool_choice != "none"

    @property
    def penalized(self) -> bool:
        """Whether any of bias or penalties changes the logits."""
        return bool(self.logit_bias) or self.repetition_penalty != 1.0 or \
            self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def to_dict(self, *, changed: bool = False) -> dict[str, Any]:
        """The wire form (msgpack and JSON safe): ``stop`` a list, ``logit_bias`` {str(id): bias}.
        ``changed``: only the fields not exactly at their defaults (type and sign too: 0 and -0.0
        are not 0.0), which ``from_dict`` fills in again."""
        # A dataclass's __dict__: its fields, in declaration order.
        d = _changed(self.__dict__) if changed else dict(self.__dict__)
        if "stop" in d:
            d["stop"] = list(self.stop)
        if "logit_bias" in d:
            d["logit_bias"] = {str(token): bias for token, bias in self.logit_bias}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SamplingParams:
        """Validated parameters from a peer's map; InvalidRequestError names the first bad field.
        Maps equal but for ``seed`` share one SamplingParams (frozen), built and checked once;
        then only the seed is checked: each request brings its own (the broker and the worker
        check every SUBMIT and REQUEST, most of them alike)."""
        params = _shared(d)
        if params is None:
            return _built(d)
        seed = d.get("seed")
        return params if seed is None else params.with_seed(seed)


def _built(d: Mapping[str, Any]) -> SamplingParams:
    """``SamplingParams.from_dict`` without sharing: every field checked now."""
    # Names as text, whatever the keys are (a msgpack map's may be bytes or huge).
    unknown = sorted(k[:40] if bounds.is_text(k) else bounds.describe(k) for k in d if k not in _FIELDS)
    if unknown:
        raise InvalidRequestError(
            f"sampling: unknown parameter(s) {unknown[:8]}; valid: {sorted(_FIELDS)}", param=unknown[0])
    return SamplingParams(**d)


def _shared(d: Mapping[str, Any]) -> SamplingParams | None:
    """The SamplingParams shared by maps equal to ``d`` but for its seed (whose is None); None where
    ``d`` is not shared (``_shared_key``) or not valid (then built in full, so that the error names
    the same field as ever: the check of seed comes before some others)."""
    key = _shared_key(d)
    try:
        return None if key is None else _shared_by_key(key)
    except Exception:  # an InvalidRequestError, or a validator's own (llguidance, json)
        return None


def _shared_key(d: Mapping[str, Any]) -> bytes | None:
    """``d`` with seed None, packed: equal keys are equal maps, to a float's bits (-0.0 is not 0.0),
    an int's type (True is not 1) and the order of names. None for what cannot be packed exactly
    (a tuple, a subclass, an int past 64 bits) or a key over _SHARED_KEY_BYTES (a long schema)."""
    if type(d) is not dict:
        return None
    try:
        key = msgpack.packb(dict(d, seed=None), use_bin_type=True, strict_types=True)
    except Exception:  # msgpack's several types for what it cannot pack
        return None
    return key if len(key) <= _SHARED_KEY_BYTES else None


@functools.lru_cache(maxsize=256)
def _shared_by_key(key: bytes) -> SamplingParams:
    """The SamplingParams of a ``_shared_key``; what it raises is not kept."""
    return _built(msgpack.unpackb(key))


def _changed(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` without those exactly at their defaults (most still hold the default object)."""
    out = {}
    for name, value in fields.items():
        default = _DEFAULTS[name]
        if value is not default and (type(value) is not type(default) or value != default or (
                type(value) is float and math.copysign(1.0, value) != math.copysign(1.0, default))):
            out[name] = value
    return out


def _logit_bias(raw: Any) -> tuple[tuple[int, float], ...]:
    """{id: bias} (ids as ints or ASCII digit strings) or ((id, bias), ...) as sorted pairs."""
    try:
        pairs = raw.items() if isinstance(raw, Mapping) else raw
        if not isinstance(pairs, tuple | list | _ITEMS) or len(pairs) > bounds.MAX_LOGIT_BIAS_ENTRIES:
            raise TypeError
        out: dict[int, float] = {}
        for token, bias in pairs:
            if type(token) is str and 0 < len(token) <= _ID_DIGITS and token.isascii() and token.isdigit():
                token = int(token)
            if type(token) is not int or not 0 <= token <= bounds.MAX_TOKEN_ID or type(bias) not in _NUM \
                    or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise TypeError
            out[token] = float(bias)
    except (TypeError, ValueError):
        raise InvalidRequestError(
            f"sampling: logit_bias must map token ids (integers in [0, {bounds.MAX_TOKEN_ID}] or their "
            f"ASCII decimal strings; at most {bounds.MAX_LOGIT_BIAS_ENTRIES}) to numbers in "
            f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]; got {bounds.describe(raw)}",
            param="logit_bias") from None
    return tuple(sorted(out.items()))


_SHARED_KEY_BYTES = 4096  # the most a shared key holds: 256 keys, at most 1 MiB
_new = object.__new__
_ID_DIGITS = len(str(bounds.MAX_TOKEN_ID))
_ITEMS = type({}.items())
_INF = math.inf
# (field, accepted types, range check, what a valid value is): bounds.py's ranges.
_CHECKS = (
    ("max_tokens", _INT, lambda v: 1 <= v <= bounds.MAX_TOKENS,
     f"must be an integer in [1, {bounds.MAX_TOKENS}]"),
    ("temperature", _NUM, lambda v: 0 <= v <= MAX_TEMPERATURE,
     f"must be a number in [0, {MAX_TEMPERATURE:g}] (0 means greedy)"),
    ("top_k", _INT, lambda v: 0 <= v <= bounds.MAX_TOP_K,
     f"must be an integer in [0, {bounds.MAX_TOP_K}] (0 disables it)"),
    ("top_p", _NUM, lambda v: 0 < v <= 1, "must be a number in (0, 1] (1 disables it)"),
    ("seed", (int, type(None)), lambda v: v is None or 0 <= v < bounds.SEED_RANGE,
     "must be an integer in [0, 2**63) or None"),
    ("stop", (tuple,), lambda v: len(v) <= bounds.MAX_STOP and all(
        bounds.is_text(s) and 0 < len(s) <= bounds.MAX_STOP_CHARS for s in v),
     f"must be a string or a list of at most {bounds.MAX_STOP} non-empty UTF-8 strings of at most "
     f"{bounds.MAX_STOP_CHARS} characters"),
    ("ignore_eos", (bool,), lambda v: True, "must be true or false"),
    ("min_p", _NUM, lambda v: 0 <= v <= 1, "must be a number in [0, 1] (0 disables it)"),
    ("presence_penalty", _NUM, lambda v: -MAX_PENALTY <= v <= MAX_PENALTY,
     f"must be a number in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}] (0 disables it)"),
    ("frequency_penalty", _NUM, lambda v: -MAX_PENALTY <= v <= MAX_PENALTY,
     f"must be a number in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}] (0 disables it)"),
    ("repetition_penalty", _NUM, lambda v: 0 < v < _INF, "must be a number > 0 (1 disables it)"),
    ("logit_bias", (tuple,), lambda v: True, "must map token ids to biases"),
    ("parallel_tool_calls", (bool,), lambda v: True, "must be true or false"),
    ("logprobs", (int, type(None)), lambda v: v is None or 0 <= v <= MAX_LOGPROBS,
     f"must be None, true or an integer in [0, {MAX_LOGPROBS}] (top alternatives per token)"),
)
_SEED_CHECK = next(check for check in _CHECKS if check[0] == "seed")


def _check(check: tuple, value: Any) -> None:
    """InvalidRequestError naming the field unless ``value`` passes ``check`` (an entry of _CHECKS)."""
    name, types, ok, why = check
    # Exact types: a bool is not an int here. NaN fails every range check.
    if type(value) not in types or not ok(value):
        raise InvalidRequestError(f"sampling: {name} {why} (got {bounds.describe(value)})", param=name)


_FIELDS = frozenset(SamplingParams.__dataclass_fields__)
_DEFAULTS = dict(SamplingParams().__dict__)
