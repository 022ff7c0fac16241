"""response_format on the wire: its shapes (OpenAI's included), and a bad one refused where the
request is made (the client, the broker), naming the problem, before any worker sees it."""

from __future__ import annotations

import pytest

from ovpool import errors
from ovpool.broker.router import Router
from ovpool.protocol import (
    Error,
    Ready,
    Request,
    Submit,
    decode,
    encode,
    sampling_from_wire,
    sampling_to_wire,
)
from ovpool.sampling_params import SamplingParams
from ovpool.submit import make_submit

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
UNSATISFIABLE = {"type": "object", "required": ["a"],
                 "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}}}


@pytest.mark.parametrize("given, canonical", [
    ({"type": "json_schema", "schema": SCHEMA}, {"type": "json_schema", "schema": SCHEMA}),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}},
     {"type": "json_schema", "schema": SCHEMA}),
    ({"type": "json_object"}, {"type": "json_object"}),
    ({"type": "regex", "pattern": "[a-z]+"}, {"type": "regex", "pattern": "[a-z]+"}),
    ({"type": "grammar", "lark": 'start: "a"'}, {"type": "grammar", "lark": 'start: "a"'}),
    ({"type": "grammar", "gbnf": 'root ::= "a"'}, {"type": "grammar", "gbnf": 'root ::= "a"'}),
    ({"type": "text"}, None), (None, None),
])
def test_each_shape_has_one_canonical_form_that_travels(given, canonical):
    params = SamplingParams(response_format=given)
    assert params.response_format == canonical
    frames = encode(Submit("r", "m", sampling_to_wire(params), prompt="p"))
    assert sampling_from_wire(decode(frames).params) == params


@pytest.mark.parametrize("fmt, words", [
    ("json", "must be a map"), ({"type": "xml"}, "must be a map"),
    ({"type": "json_schema"}, "exactly one of"), ({"type": "json_schema", "schema": []}, "must be a map"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, '"schema"'),
    ({"type": "json_object", "schema": SCHEMA}, "no other field"),
    ({"type": "regex"}, "pattern"), ({"type": "regex", "pattern": "[0-9"}, "unclosed"),
    ({"type": "grammar", "lark": "start: nowhere"}, "nowhere"), ({"type": "grammar"}, '"lark" or "gbnf"'),
    ({"type": "json_schema", "schema": UNSATISFIABLE}, "unsatisfiable"),
    ({"type": "json_schema", "schema": {"type": "string", "pattern": "a("}}, "unclosed group"),
    ({"type": "json_schema", "schema": {"$ref": "#/$defs/missing"}}, "missing"),
])
def test_a_bad_constraint_is_an_invalid_request_naming_the_problem(fmt, words):
    with pytest.raises(errors.InvalidRequestError, match=f"(?s)response_format: .*{words}"):
        SamplingParams(response_format=fmt)


def test_the_client_refuses_a_bad_constraint_before_sending():
    with pytest.raises(errors.InvalidRequestError, match="unsatisfiable"):
        make_submit("p", "m", None, {"response_format": {"type": "json_schema", "schema": UNSATISFIABLE}})
    msg = make_submit("p", "m", None, {"response_format": {"type": "json_object"}})
    assert msg.params["response_format"] == {"type": "json_object"}


def test_the_broker_refuses_a_bad_constraint_and_no_worker_gets_it():
    router = Router(now=0.0, queue_limit=2, max_new_tokens=100)
    router.handle(b"w", Ready("w", ["m"], "CPU", 1, "host", 1), 1000.0)
    bad = Submit("x", "m", {"response_format": {"type": "regex", "pattern": "(["}}, prompt="p")
    (peer, err), = router.handle(b"c", bad, 1000.0)
    assert peer == b"c" and isinstance(err, Error) and err.code == errors.InvalidRequestError.code
    assert "response_format" in err.message and "regex" in err.message
    good = Submit("y", "m", {"max_tokens": 4, "response_format": {"type": "regex", "pattern": "[0-9]+"}},
                  prompt="p")
    sent = [m for _, m in router.handle(b"c", good, 1000.0) if isinstance(m, Request)]
    assert sent and sent[0].params["response_format"] == {"type": "regex", "pattern": "[0-9]+"}


def test_importing_the_client_does_not_import_llguidance():
    import subprocess
    import sys

    code = "import sys, ovpool.client, ovpool.async_client; print('llguidance' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def _deep(levels: int) -> dict:
    schema: dict = {}
    for _ in range(levels):
        schema = {"items": schema}
    return schema


@pytest.mark.parametrize("schema, words", [
    (_deep(100_000), "nested more than 64 levels"),  # checked without recursion: no RecursionError
    ({"enum": ["x" * (1 << 20)]}, "larger than"),
    ({"maximum": 2**64}, "integer of 65 bits"),
    ({"minimum": -(2**63) - 1}, "integer of 64 bits"),
    ({"enum": [-(2**63) + 1]}, "-9223372036854775807"),  # llguidance 1.9 segfaulted on it
    ({"items": {"const": {"a": -(2**63)}}}, "-9223372036854775808"),
    ({"maximum": float("inf")}, "inf"),
    ({"enum": [b"raw"]}, "bytes"),
    ({"enum": ["\ud800"]}, "UTF-8 cannot encode"),
    ({"properties": {"\ud800": {}}}, "keys must be UTF-8"),
    ({"properties": {b"k": {}}}, "keys must be UTF-8"),
])
def test_a_constraint_the_wire_cannot_carry_is_refused_before_llguidance(schema, words):
    with pytest.raises(errors.InvalidRequestError, match=words) as info:
        SamplingParams(response_format={"type": "json_schema", "schema": schema})
    assert info.value.param == "response_format"


def test_a_constraint_at_the_edges_is_taken():
    edges = {"enum": [-(2**63) + 1024, 2**64 - 1]}
    fmt = SamplingParams(response_format={"type": "json_schema", "schema": edges}).response_format
    assert fmt["schema"] == edges
    assert SamplingParams(response_format={"type": "json_schema", "schema": _deep(60)}).response_format


@pytest.mark.parametrize("fmt", [
    {"type": "json_schema", "schema": {"enum": [b"raw bytes"]}},  # issue 24: a traceback, no answer
    {"type": "json_schema", "schema": {"enum": [-(2**63)]}},  # would segfault the broker in llguidance
    {"type": []},
])
def test_the_broker_answers_a_raw_submit_it_cannot_use_with_an_error(fmt):
    router = Router(now=0.0, queue_limit=2, max_new_tokens=100)
    router.handle(b"w", Ready("w", ["m"], "CPU", 1, "host", 1), 1000.0)
    (peer, err), = router.handle(b"c", Submit("x", "m", {"response_format": fmt}, prompt="p"), 1000.0)
    assert peer == b"c" and isinstance(err, Error) and err.code == errors.InvalidRequestError.code
    assert "response_format" in err.message
