"""SamplingParams: every field's validation names the field and its range; the wire form survives
msgpack (logit_bias ids as ints or strings) and round-trips through SUBMIT."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import msgpack
import pytest

from ovpool import errors
from ovpool.protocol import Submit, decode, encode, sampling_from_wire, sampling_to_wire
from ovpool.sampling_params import SamplingParams
from tests.test_response_format import _deep


@pytest.mark.parametrize("field, value, words", [
    ("min_p", 1.5, r"min_p must be a number in \[0, 1\]"),
    ("min_p", -0.1, "min_p"),
    ("presence_penalty", 2.5, r"presence_penalty must be a number in \[-2, 2\]"),
    ("frequency_penalty", -3, r"frequency_penalty must be a number in \[-2, 2\]"),
    ("repetition_penalty", 0, "repetition_penalty must be a number > 0"),
    ("repetition_penalty", float("inf"), "repetition_penalty"),
    ("logprobs", 21, r"logprobs must be None, true or an integer in \[0, 20\]"),
    ("logprobs", -1, "logprobs"),
    ("logprobs", 1.0, "logprobs"),
    ("logit_bias", {"x": 1}, "logit_bias must map token ids"),
    ("logit_bias", {-1: 1}, "logit_bias"),
    ("logit_bias", {1: float("nan")}, "logit_bias"),
    ("logit_bias", {1: "big"}, "logit_bias"),
    ("logit_bias", 5, "logit_bias"),
    ("temperature", "hot", "temperature must be a number"),
    ("top_p", float("nan"), "top_p"),
    ("max_tokens", True, "max_tokens must be an integer"),
    ("seed", 2**63, "seed"),
    ("stop", 5, "stop"),
])
def test_bad_values_name_the_field_and_its_range(field, value, words):
    with pytest.raises(errors.InvalidRequestError, match=words) as raised:
        SamplingParams(**{field: value})
    assert raised.value.param == field
    with pytest.raises(errors.InvalidRequestError, match=field):
        sampling_from_wire({field: value})


def test_logit_bias_takes_int_or_string_ids_in_range():
    p = SamplingParams(logit_bias={"7": 100, 3: -1.5, "12": -100.0})
    assert p.logit_bias == ((3, -1.5), (7, 100.0), (12, -100.0))
    assert p.to_dict()["logit_bias"] == {"3": -1.5, "7": 100.0, "12": -100.0}
    assert SamplingParams(logit_bias=p.logit_bias) == p == SamplingParams.from_dict(p.to_dict())


def test_logprobs_true_means_the_chosen_token_only_and_false_none():
    assert SamplingParams(logprobs=True).logprobs == 0
    assert SamplingParams(logprobs=False).logprobs is None
    assert SamplingParams(logprobs=20).logprobs == 20


def test_every_field_survives_the_wire():
    p = SamplingParams(max_tokens=9, temperature=0.7, top_k=40, top_p=0.9, seed=5, stop=("x", "yz"),
                       min_p=0.05, presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2,
                       logit_bias={50256: -100, 17: 2.5}, logprobs=5)
    sent = Submit("r", "m", sampling_to_wire(p), prompt="hi")
    got = decode(encode(sent))  # msgpack maps need string keys: logit_bias ids travel as strings
    assert got == sent and sampling_from_wire(got.params) == p


def test_a_single_stop_string_is_one_stop_string():
    assert SamplingParams(stop="END").stop == ("END",)


def test_a_wire_map_with_odd_keys_or_shapes_is_an_invalid_request():
    with pytest.raises(errors.InvalidRequestError, match="unknown parameter.*'a bytes', 'y'"):
        sampling_from_wire({b"x": 1, "y": 2, "max_tokens": 3})
    for fmt in ({"type": []}, {"type": {"a": 1}}, {"type": "json_schema", "schema": {b"k": 1}}):
        with pytest.raises(errors.InvalidRequestError) as info:
            sampling_from_wire({"response_format": fmt})
        assert info.value.param == "response_format"


@pytest.mark.parametrize("field, value", [
    ("max_tokens", 2**64), ("max_tokens", 2**31), ("top_k", 2**64), ("temperature", 3),
    ("temperature", 2.0001), ("stop", ["\ud800"]), ("stop", ["s"] * 17), ("stop", ["s" * 1025]),
    ("logit_bias", {"\u00b2": 1}), ("logit_bias", {"1" * 5000: 1}), ("logit_bias", {"5": 101}),
    ("logit_bias", {str(i): 1 for i in range(301)}), ("logit_bias", {2**31: 1}),
])
def test_values_the_wire_cannot_carry_or_openai_refuses_are_invalid(field, value):
    with pytest.raises(errors.InvalidRequestError) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field


def test_the_edges_of_each_range_are_accepted():
    p = SamplingParams(max_tokens=2**31 - 1, top_k=2**31 - 1, temperature=2, stop=["s" * 1024] * 16,
                       logit_bias={str(i): 100 for i in range(300)}, seed=2**63 - 1)
    assert len(p.logit_bias) == 300 and p.to_dict()["max_tokens"] == 2**31 - 1


def test_with_seed_equals_building_with_that_seed_and_checks_only_the_seed():
    base = SamplingParams(max_tokens=4, temperature=0.7, stop=["x"], logit_bias={"3": 1})
    assert base.with_seed(9) == SamplingParams(max_tokens=4, temperature=0.7, stop=["x"], logit_bias={"3": 1},
                                               seed=9)
    assert base.seed is None  # a copy: the original keeps its own
    for bad in (-1, 2**63, True, 1.0):
        with pytest.raises(errors.InvalidRequestError) as copied:
            base.with_seed(bad)
        with pytest.raises(errors.InvalidRequestError) as built:
            SamplingParams(max_tokens=4, seed=bad)
        assert str(copied.value) == str(built.value) and copied.value.param == "seed"


def test_the_plain_form_holds_every_field_in_order_seeded_copies_too():
    """to_dict: each field once, in declaration order (msgpack keeps it), and a with_seed copy's
    own seed."""
    p = SamplingParams(seed=3, stop="x", logprobs=True).with_seed(5)
    wire = p.to_dict()
    assert list(wire) == [f.name for f in dataclasses.fields(SamplingParams)]
    assert (wire["seed"], wire["stop"], wire["logprobs"]) == (5, ["x"], 0)


@pytest.mark.parametrize("given", [{}, {"temperature": 0}, {"temperature": -0.0}, {"top_p": 1},
                                   {"logprobs": 0},
                                   {"seed": 0, "stop": "x", "max_tokens": 128, "repetition_penalty": 1.0},
                                   {"logit_bias": {"0": -0.0}, "min_p": 0.0, "parallel_tool_calls": False}])
def test_the_wire_form_holds_what_differs_from_the_defaults_and_comes_back_to_the_bit(given):
    """A SUBMIT's params map: the fields not exactly at their defaults (0 is not 0.0, -0.0 is not
    0.0), in declaration order; the receiver's SamplingParams equals the sender's, to the bit."""
    p = SamplingParams(**given)
    wire = sampling_to_wire(p)
    full = p.to_dict()
    plain = SamplingParams().to_dict()
    assert list(wire) == [name for name in full if msgpack.packb(full[name]) != msgpack.packb(plain[name])]
    assert msgpack.packb(sampling_from_wire(decode(encode(Submit("r", "m", wire))).params).to_dict()) == \
        msgpack.packb(full)


# Maps alike but for their seed, as the broker and the worker see them: the first builds, the rest share.
_ALIKE = [{"max_tokens": 4, "temperature": 0.0, "seed": 1}, {"max_tokens": 4, "temperature": -0.0, "seed": 2},
          {"max_tokens": 4, "temperature": 0, "seed": 3}, {"max_tokens": 4, "temperature": 1, "seed": None},
          {"max_tokens": 4, "logprobs": True}, {"max_tokens": 4, "logprobs": 1, "seed": 5},
          {"seed": 9, "max_tokens": 4, "stop": ["x", "y"], "logit_bias": {"3": 1}},
          {"max_tokens": 4, "stop": ("x", "y"), "seed": 9}, SamplingParams(max_tokens=4, seed=7).to_dict(),
          {"max_tokens": 4, "response_format": {"type": "regex", "pattern": "a+"}, "seed": 4}]


def test_maps_alike_share_a_build_that_equals_a_full_one_to_the_bit():
    """from_dict keeps one SamplingParams per map but for its seed: whichever came first, each map's
    equals its own full build, to a float's sign and a number's type (compared as packed)."""
    for d in _ALIKE * 2:
        got, want = SamplingParams.from_dict(d), SamplingParams(**d)
        assert msgpack.packb(got.to_dict()) == msgpack.packb(want.to_dict()), d
    kept = {"max_tokens": 4, "stop": ["x"], "seed": 1}
    first = SamplingParams.from_dict(kept)
    kept["stop"].append("y")  # the caller's map changes after the build: no later one sees it
    assert SamplingParams.from_dict({"max_tokens": 4, "stop": ["x"]}).stop == first.stop == ("x",)


@pytest.mark.parametrize("bad", [{"seed": -1}, {"seed": True}, {"seed": 2**63}, {"seed": -1, "stop": [""]},
                                 {"seed": -1, "temperature": 9}, {"top_p": 0}, {"bogus": 1, "seed": -1},
                                 {"response_format": {"type": "regex", "pattern": "("}, "seed": -1}])
def test_a_map_alike_but_for_a_bad_value_fails_as_a_full_build_does(bad):
    """The first bad field in the full check's order is named, though the rest of the map was
    built and kept before (the seed is checked before stop, after temperature)."""
    good = {"max_tokens": 4, "stop": ["x"], "temperature": 0.5, "seed": 1}
    SamplingParams.from_dict(good)
    with pytest.raises(errors.InvalidRequestError) as shared:
        SamplingParams.from_dict({**good, **bad})
    with pytest.raises(errors.InvalidRequestError) as full:
        SamplingParams.from_dict(MappingProxyType({**good, **bad}))  # not a dict: never shared
    assert (str(shared.value), shared.value.param) == (str(full.value), full.value.param)


@pytest.mark.parametrize("field, value", [
    ("max_tokens", 2**64), ("seed", 2**64), ("stop", ["\ud800"]), ("stop", ["s"] * 10**6),
    ("logit_bias", {str(i): 1 for i in range(10**6)}), ("stop", [_deep(10_000)]),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": _deep(100_000)}}),
])
def test_hostile_maps_fail_on_the_shared_path_as_a_full_build_does(field, value):
    """What the shared key cannot pack (an int past 64 bits, a lone surrogate, deep nesting) or
    would not keep (a million items) is built in full: the same error, naming the same field."""
    d = {field: value} if field == "seed" else {field: value, "seed": 1}
    with pytest.raises(errors.InvalidRequestError) as shared:
        SamplingParams.from_dict(d)
    with pytest.raises(errors.InvalidRequestError) as full:
        SamplingParams.from_dict(MappingProxyType(d))
    assert (str(shared.value), shared.value.param) == (str(full.value), full.value.param)
    assert shared.value.param == field
