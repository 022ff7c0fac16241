"""The dialects' translations as pure functions: an Anthropic or Responses body becomes exactly the
chat request of the same conversation; /v1/models' capabilities; hostile bodies fuzzed straight
into the parsers get an InvalidRequestError or a Generate, never another exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovpool import errors
from ovpool.api import anthropic, models, openai_responses
from ovpool.api.keys import ApiKeys
from ovpool.api.schema import parse_chat
from ovpool.completion import Completion, Usage

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_an_anthropic_body_is_the_chat_request_of_its_conversation():
    gen = anthropic.parse({"model": "m", "max_tokens": 9, "system": "be brief", "stop_sequences": ["END"],
                           "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                           "temperature": 0.5, "top_p": 0.9, "top_k": 4, "seed": 3, "stream": True,
                           "metadata": {"user_id": "u"},
                           "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}})
    chat = parse_chat({"model": "m", "messages": CHAT, "max_tokens": 9, "stop": ["END"], "temperature": 0.5,
                       "top_p": 0.9, "top_k": 4, "seed": 3, "stream": True, "response_format": {
                           "type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA}}}, 64)
    assert gen == chat
    counted = anthropic.parse_count({"model": "m", "system": "be brief", "messages": CHAT[1:]})
    assert counted.choices[0].prompt == CHAT and counted.choices[0].sampling["max_tokens"] == 1


def test_a_responses_body_is_the_chat_request_of_its_conversation():
    schema = {"name": "a", "schema": SCHEMA, "strict": True}
    gen = openai_responses.parse({"model": "m", "instructions": "be brief", "input": "hi",
                                  "max_output_tokens": 9, "temperature": 0.5, "store": True,
                                  "tool_choice": "auto",
                                  "text": {"format": {"type": "json_schema", **schema}}}, 64)
    chat = parse_chat({"model": "m", "messages": CHAT, "max_tokens": 9, "temperature": 0.5,
                       "response_format": {"type": "json_schema", "json_schema": schema}}, 64)
    assert gen == chat
    default = openai_responses.parse({"model": "m", "input": "hi", "text": {"format": {"type": "text"}}}, 64)
    sampling = default.choices[0].sampling
    assert sampling["max_tokens"] == 64 and "response_format" not in sampling
    as_object = openai_responses.parse({"model": "m", "input": "hi",
                                        "text": {"format": {"type": "json_object"}}}, 64)
    assert as_object.choices[0].sampling["response_format"]["type"] == "json_object"


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
TOOL_CHAT = {"model": "m", "max_tokens": 9, "messages": [
    *CHAT, {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}, {"role": "user", "content": "and?"}],
    "tools": [{"type": "function", "function": {"name": "weather", "description": "d", "parameters": WEATHER,
                                                "strict": True}}],
    "tool_choice": {"type": "function", "function": {"name": "weather"}}, "parallel_tool_calls": False}


def test_every_dialects_tools_and_tool_history_are_the_chat_requests():
    claude = anthropic.parse({
        "model": "m", "max_tokens": 9, "system": "be brief",
        "tools": [{"name": "weather", "description": "d", "input_schema": WEATHER, "strict": True}],
        "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {
                         "type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}}]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": "call_1", "content": "18 C"},
                         {"type": "text", "text": "and?"}]}]})
    responses = openai_responses.parse({
        "model": "m", "max_output_tokens": 9, "instructions": "be brief", "parallel_tool_calls": False,
        "tools": [{"type": "function", "name": "weather", "description": "d", "parameters": WEATHER}],
        "tool_choice": {"type": "function", "name": "weather"},
        "input": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Checking."},
                  {"type": "function_call", "call_id": "call_1", "name": "weather",
                   "arguments": '{"city": "Paris"}'},
                  {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
                  {"role": "user", "content": "and?"}]}, 64)
    chat = parse_chat(TOOL_CHAT, 64)
    assert claude == responses == chat
    assert chat.choices[0].sampling["tools"] == [
        {"name": "weather", "description": "d", "parameters": WEATHER, "strict": True}]
    assert chat.choices[0].sampling["tool_choice"] == {"name": "weather"}


@pytest.mark.parametrize("parse, body", [
    (lambda b: parse_chat(b, 64), {"model": "m", "messages": CHAT}),
    (lambda b: openai_responses.parse(b, 64), {"model": "m", "input": "hi"}),
    (anthropic.parse, {"model": "m", "max_tokens": 2, "messages": CHAT[1:]}),
])
def test_a_tool_choice_needing_tools_is_refused_without_them_by_every_dialect(parse, body):
    required = {"type": "any"} if parse is anthropic.parse else "required"
    with pytest.raises(errors.InvalidRequestError, match="only allowed when tools are given") as info:
        parse({**body, "tool_choice": required})
    assert info.value.param == "tool_choice"
    no_tool = {"type": "none"} if parse is anthropic.parse else "none"
    assert parse({**body, "tool_choice": no_tool, "tools": []}) == parse(body)


def test_models_say_chat_unless_a_worker_says_its_model_has_no_template():
    status = {"uptime_s": 1.0, "workers": [
        {"models": ["smol", "alias"], "load": {"outcome": "hit", "chat": True}},
        {"models": ["gemma"], "load": {"outcome": "hit", "chat": False}},
        {"models": ["smol"], "load": {}},  # the null backend, or an older worker: says nothing
        {"models": ["odd"], "load": "not a map"}]}
    assert {m["id"]: (m["workers"], m["capabilities"]) for m in models.listed(status)} == {
        "alias": (1, ["chat", "completion"]), "gemma": (1, ["completion"]),
        "odd": (1, ["chat", "completion"]), "smol": (2, ["chat", "completion"])}
    assert models.one(status, "gemma")["capabilities"] == ["completion"]
    # A model serve loads on demand says so before any worker runs it: its entries' ``chat``.
    status["supervised"] = [{"model": "base", "residency": "unloaded", "chat": 0},
                            {"model": "instruct", "residency": "unloaded", "chat": 1}]
    assert [(m["id"], m["state"], m["capabilities"]) for m in models.listed(status)][1:3] == [
        ("base", "unloaded", ["completion"]), ("gemma", "loaded", ["completion"])]
    assert models.one(status, "instruct")["capabilities"] == ["chat", "completion"]
    with pytest.raises(errors.ModelNotFoundError, match="'nope'"):
        models.one(status, "nope")


def test_keys_are_taken_from_x_api_key_when_there_is_no_authorization():
    keys = ApiKeys(["k1"])
    keys.check(None, "k1")
    keys.check("Bearer k1", "wrong")  # Authorization decides when both are sent
    for authorization, api_key in ((None, "k2"), ("Bearer k2", "k1"), (None, ""), (None, None), ("", "k1")):
        with pytest.raises(errors.UnauthorizedError):
            keys.check(authorization, api_key)


def test_anthropic_errors_are_its_error_json_by_status():
    for exc, kind in ((errors.InvalidRequestError("x"), "invalid_request_error"),
                      (errors.UnauthorizedError("x"), "authentication_error"),
                      (errors.ModelNotFoundError("x"), "not_found_error"),
                      (errors.QueueFullError("x"), "rate_limit_error"),
                      (errors.WorkerLostError("x"), "overloaded_error"),
                      (errors.RequestTimeoutError("x"), "api_error"),
                      (errors.InferenceError("x"), "api_error")):
        assert anthropic.body(exc) == {"type": "error", "error": {"type": kind, "message": "x"}}
    assert anthropic.http_body(413, "big")["error"]["type"] == "request_too_large"


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16)
_ANTHROPIC = ["model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p", "top_k",
              "metadata", "stream", "tools", "tool_choice", "seed", "timeout", "output_config"]
_RESPONSES = ["model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "text", "stream",
              "store", "previous_response_id", "conversation", "tools", "tool_choice", "seed", "timeout"]
_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "developer", "x"]) | _json,
                                  "content": _json | st.lists(st.fixed_dictionaries({
                                      "type": st.sampled_from(["text", "input_text", "image", "tool_use"]),
                                      "text": _json}), max_size=3)})
_value = _json | st.lists(_message, max_size=3) | st.sampled_from([
    "m", 1, 2**64, -1, float("nan"), "\ud800", [{"role": "user", "content": "\ud800"}],
    {"format": {"type": "json_schema", "name": "a", "schema": {"type": 7}}},
    {"format": {"type": "json_object"}}, {"format": {"type": "json_schema", "schema": {"maximum": 2**70}}}])
_BASES = {anthropic.parse: {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
          anthropic.parse_count: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
          lambda body: openai_responses.parse(body, 64): {"model": "m", "input": "hi"}}


@settings(max_examples=400, deadline=None, derandomize=True)
@given(which=st.sampled_from(list(_BASES)), fields=st.data())
def test_fuzzed_bodies_are_a_generate_or_an_invalid_request(which, fields):
    names = _ANTHROPIC if which in (anthropic.parse, anthropic.parse_count) else _RESPONSES
    body = {**_BASES[which], **fields.draw(st.dictionaries(st.sampled_from(names), _value, max_size=4))}
    try:
        gen = which(body)
    except errors.InvalidRequestError as exc:
        assert exc.param is None or exc.param.split(".")[0].split("[")[0] in str(exc)  # names its field
        return
    assert len(gen.choices) == 1
    json.dumps(gen.choices[0].prompt)  # what the wire carries: JSON-able, no lone surrogate reached it
    assert all(m["content"].encode() is not None for m in gen.choices[0].prompt)


def test_a_stream_failing_after_its_first_token_ends_with_its_apis_error_event():
    lost = errors.WorkerLostError("the worker went away")
    writer = anthropic.MessageWriter(anthropic.parse(_BASES[anthropic.parse]))
    assert writer.failure(lost) == (b'event: error\ndata: {"type":"error","error":{"type":'
                                    b'"overloaded_error","message":"the worker went away"}}\n\n')
    writer = openai_responses.ResponseWriter(openai_responses.parse({"model": "m", "input": "hi"}, 64))
    opening = writer.opening()  # response.created and .in_progress: sequence numbers 0-1
    assert opening.count(b"event: ") == 2
    name, data = writer.failure(lost).decode().split("\n")[:2]
    assert name == "event: error" and json.loads(data.removeprefix("data: ")) == {
        "type": "error", "sequence_number": 2, "code": lost.code, "message": "the worker went away",
        "param": None}


def test_anthropic_says_which_stop_sequence_ended_the_message():
    gen = anthropic.parse({**_BASES[anthropic.parse], "stop_sequences": ["END", "STOP"]})
    usage = Usage(4, 2)
    stopped = Completion("a b", [1, 2], "stop", usage, stop="STOP")
    ended = Completion("a b", [1, 2], "stop", usage)  # the end-of-turn token
    assert [(m["stop_reason"], m["stop_sequence"]) for m in (anthropic.full(gen, [stopped]),
                                                           anthropic.full(gen, [ended]))] == [
        ("stop_sequence", "STOP"), ("end_turn", None)]
    writer = anthropic.MessageWriter(gen)
    writer.opening()
    writer.done(0, stopped)
    lines = writer.closing().decode().split("\n")
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "STOP"}
