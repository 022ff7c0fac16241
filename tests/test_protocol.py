"""Wire messages: every one round-trips, and anything malformed is a ProtocolError, never a crash."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovpool import errors
from ovpool.completion import Completion, Logprob, TokenLogprobs, Usage
from ovpool.protocol import (
    VERSION,
    Cancel,
    Disconnect,
    Drain,
    Error,
    Final,
    Heartbeat,
    LoadFailed,
    Message,
    ModelOrder,
    Partial,
    Ping,
    Pong,
    Ready,
    Request,
    Shutdown,
    Status,
    StatusReply,
    Submit,
    Supervised,
    decode,
    encode,
    load_to_wire,
    message_type,
    request_id_of,
    sampling_from_wire,
)

EXAMPLES = [
    Submit("r1", "m", {"max_tokens": 3, "seed": 7}, prompt="hi", timeout_s=2.5),
    Submit("r2", "", {}, messages=[{"role": "user", "content": "hé"}]),
    Cancel("r1"), Status(), Ping(["a", "b"]), Pong([]),
    Partial("r1", 3, 42, " wörld", 3),
    Final("r1", {"text": "x", "token_ids": [1], "finish_reason": "stop",
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1}, "timings": {"total_s": 0.5}}),
    Error("r1", "request.timeout", "too slow"), StatusReply({"workers": []}),
    Ready("w", ["m", "alias"], "GPU.1", 4, "host", 123), Heartbeat(), Disconnect(["r1"]),
    Ready("w", ["m"], "CPU", 4, "host", 123, {"outcome": "hit", "seconds": 0.4, "entry": "f-p"}),
    Supervised("host", 7, [{"name": "GPU.1", "state": "failing", "reason": "cache MISS", "pid": None}]),
    Request("r1", "m", {"max_tokens": 3}, prompt="hi"), Drain("", 30.0), Drain("CPU#1", 5.0),
    ModelOrder("gemma3-270m", "load"),
    Shutdown("stopped by a signal"), Shutdown(),
    LoadFailed("CPU@h:9", ["smollm2"], "CPU", "h", 9, "model.unsupported", "architecture 'x' ..."),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg):
    frames = encode(msg)
    assert frames[0] == VERSION and len(frames) == 3
    assert decode(frames) == msg


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_message_type_names_the_class_without_reading_the_body(msg):
    version, command, _ = encode(msg)
    assert message_type([version, command, b"\xc1"]) is type(msg)  # \xc1: never valid msgpack


@pytest.mark.parametrize("frames, error", [
    ([b"OVP2", b"\x10", b""], errors.UnsupportedVersionError),
    ([VERSION, b"\xff", b""], errors.MalformedMessageError),
    ([VERSION, b"\x10"], errors.MalformedMessageError),
])
def test_message_type_rejects_what_decode_rejects(frames, error):
    with pytest.raises(error):
        message_type(frames)


def test_commands_are_distinct():
    assert len({encode(m)[1] for m in EXAMPLES}) == len({type(m) for m in EXAMPLES})


@pytest.mark.parametrize("frames, error, words", [
    ([b"OVP2", b"\x01", b"\x80"], errors.UnsupportedVersionError, "OVP2"),
    ([VERSION, b"\xff", b"\x80"], errors.MalformedMessageError, "unknown command"),
    ([VERSION, b"", b"\x80"], errors.MalformedMessageError, "unknown command"),
    ([VERSION, b"\x02"], errors.MalformedMessageError, "3 frames"),
    ([VERSION, b"\x02", b"\xc1"], errors.MalformedMessageError, "msgpack"),
    ([VERSION, b"\x02", msgpack.packb([1])], errors.MalformedMessageError, "map"),
    ([VERSION, b"\x02", msgpack.packb({})], errors.MalformedMessageError, "missing field 'request_id'"),
    ([VERSION, b"\x02", msgpack.packb({"request_id": 5})], errors.MalformedMessageError, "request_id"),
    ([VERSION, b"\x10", msgpack.packb({"request_id": "r", "index": True, "token_id": 1, "text": ""})],
     errors.MalformedMessageError, "index"),
])
def test_malformed_frames_name_what_is_wrong(frames, error, words):
    with pytest.raises(error, match=words):
        decode(frames)


def test_unknown_extra_fields_are_ignored_for_forward_compatibility():
    body = msgpack.packb({"request_id": "r", "added_in_a_later_version": 1})
    assert decode([VERSION, b"\x02", body]) == Cancel("r")


def test_fields_a_sender_leaves_out_get_their_defaults_each_message_its_own():
    """An older or leaner sender's map: what decode builds equals the constructor's, defaults
    included, and a default list is each message's own (mutating one leaves the next alone)."""
    body = msgpack.packb({"request_id": "r", "model": "m", "params": {}})
    first = decode([VERSION, b"\x01", body])
    assert first == Submit("r", "m", {})
    assert (first.prompt, first.messages, first.timeout_s, first.keep_alive_s) == (None, None, 0.0, None)
    heartbeats = [decode([VERSION, b"\x21", msgpack.packb({})]) for _ in range(2)]
    assert heartbeats[0] == Heartbeat() and heartbeats[0].held is not heartbeats[1].held
    assert list(first.__dict__) == list(Submit("r", "m", {}).__dict__)  # re-encoded in the same order


def test_no_message_class_needs_its_init():
    """decode fills a message's fields without calling __init__: a __post_init__ would be skipped."""
    assert not [cls.__name__ for cls in Message.__args__ if hasattr(cls, "__post_init__")]


def test_ready_carries_the_load_time_of_all_phases_the_cache_outcome_and_batching():
    report = {"outcome": "hit", "entry": "fam-ports", "graph_settings": {"stateful": "on"},
              "seconds": {"open": 0.1, "tokenizer": 0.05, "compiled model": 0.2, "warm-up": 0.05}}
    assert load_to_wire(report) == {"outcome": "hit", "seconds": 0.4, "entry": "fam-ports", "batching": None,
                                    "chat": None, "graph": {"stateful": "on"}}
    said = load_to_wire({**report, "batching": "off: setting batching=interleaved", "chat": False})
    assert said["batching"] == "off: setting batching=interleaved"
    assert said["chat"] is False  # a model without a chat template: /v1/models says completion only
    assert load_to_wire({}) == {}  # the null backend loads nothing
    assert Ready("w", ["m"], "CPU", 1, "h", 1).load == {}  # READY from an older worker


@pytest.mark.parametrize("params, words", [
    ({"max_tokens": "9"}, "max_tokens"), ({"temperature": float("nan")}, "temperature"),
    ({"seed": 2**64}, "seed"), ({"ignore_eos": 1}, "ignore_eos"), ({"top_k": 1.5}, "top_k"),
    ({"stop": [""]}, "stop"), ({"bogus": 1}, "bogus"),
])
def test_sampling_params_from_the_wire_are_validated(params, words):
    with pytest.raises(errors.InvalidRequestError, match=words):
        sampling_from_wire(params)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=5))
def test_random_frames_raise_only_protocol_errors(frames):
    try:
        decode(frames)
    except errors.ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(EXAMPLES), st.dictionaries(st.text(max_size=12), st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6), max_size=6))
def test_valid_commands_with_wrong_bodies_raise_only_protocol_errors(example, body):
    try:
        decode([VERSION, encode(example)[1], msgpack.packb(body)])
    except errors.ProtocolError:
        pass


def test_request_id_of_names_the_request_of_a_message_decode_refused():
    refused = [VERSION, bytes([Final.command]), msgpack.packb({"request_id": "r7", "completion": 1})]
    with pytest.raises(errors.MalformedMessageError):
        decode(refused)
    assert request_id_of(refused) == "r7"
    assert request_id_of([VERSION, b"\x7f", msgpack.packb({"request_id": "r7"})]) == ""  # unknown command
    assert request_id_of([VERSION, bytes([Final.command]), msgpack.packb({"request_id": 7})]) == ""
    assert request_id_of([VERSION, bytes([Final.command]), b"\xc1"]) == ""


wire_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["text", "token_ids", "finish_reason", "usage", "prompt_tokens",
                         "completion_tokens", "timings", "logprobs", "note", "new"]), inner, max_size=8),
    max_leaves=24)


@settings(max_examples=300, deadline=None)
@given(wire_values)
def test_a_completion_off_the_wire_is_a_completion_or_a_malformed_message_error(value):
    # A FINAL's completion and a PARTIAL's logprobs come from a worker, forwarded unchanged.
    for read in (Completion.from_dict, TokenLogprobs.list_from_wire):
        try:
            read(value)
        except errors.MalformedMessageError:
            pass


def test_a_completion_round_trips_and_ignores_what_a_newer_worker_adds_at_any_depth():
    c = Completion("ab", [1, 2], "stop", Usage(1, 2), {"total_s": 0.5},
                   [TokenLogprobs(Logprob(1, "a", -0.5), (Logprob(2, "b", -1.0),))] * 2, "n")
    assert Completion.from_dict(c.to_dict()) == c
    newer = c.to_dict()
    newer["usage"]["cached_tokens"] = 1
    newer["logprobs"] = [[*t, "later"] for t in newer["logprobs"]]
    assert Completion.from_dict({**newer, "added": {"x": [1]}}) == c
