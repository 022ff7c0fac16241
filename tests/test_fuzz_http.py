"""Random JSON for every field of /v1/completions, /v1/chat/completions, /v1/responses and
/v1/messages, sent as raw text (so 1e999, NaN, lone surrogates and 20-digit ints arrive as a hostile
client writes them), through the real app in front of a broker and a null worker: each example gets
a 4xx in its API's error shape (OpenAI's; Anthropic's on /v1/messages) or a 200, never a 5xx nor an
exception out of the app, and the next valid request still works."""

from __future__ import annotations

import json

import pytest
from app_helpers import assert_still_serving, post, served_app
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow  # several processes

COMPLETION_FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p",
                     "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs",
                     "seed", "stop", "n", "stream", "stream_options", "echo", "ignore_eos",
                     "response_format", "user", "timeout", "suffix", "best_of"]
CHAT_FIELDS = [f for f in COMPLETION_FIELDS if f not in ("prompt", "echo", "suffix", "best_of")] + [
    "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice"]
MESSAGES_FIELDS = ["model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p",
                   "top_k", "metadata", "stream", "tools", "tool_choice", "seed", "timeout", "output_config"]
RESPONSES_FIELDS = ["model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "text",
                    "stream", "store", "previous_response_id", "tools", "tool_choice", "seed", "timeout"]
BASES = {"/v1/completions": {"model": '"m"', "prompt": '"one two"', "max_tokens": "2"},
         "/v1/chat/completions": {"model": '"m"', "messages": '[{"role": "user", "content": "hi"}]',
                                  "max_tokens": "2"},
         "/v1/messages": {"model": '"m"', "messages": '[{"role": "user", "content": "hi"}]',
                          "max_tokens": "2"},
         "/v1/messages/count_tokens": {"model": '"m"', "messages": '[{"role": "user", "content": "hi"}]'},
         "/v1/responses": {"model": '"m"', "input": '"hi"', "max_output_tokens": "2"}}
# The admin routes, each with a base body that leaves the pool serving: a drain of a worker that is
# not registered (so any timeout_s is refused or drains nothing), a model's load or unload order
# (which only the broker records: no `ovpool serve` here carries it out).
ADMIN_BASES = {"/admin/drain": {"worker": '"no-such-worker"', "timeout_s": "1"},
               "/v1/models/m/load": {}, "/v1/models/m/unload": {},
               "/v1/models/no-such-model/load": {}}
ADMIN_FIELDS = ["timeout_s", "model", "x"]

# Raw JSON texts no json.dumps of a Python value writes, and edges of every range.
SPECIAL = ["18446744073709551616", "-18446744073709551617", "9223372036854775808", "2147483648", "-1", "0",
           "1", "20", "21", "128", "129", "1e999", "-1e999", "NaN", "Infinity", "-Infinity", "1e-400",
           "2.0000001", "-2.5", "true", "false", "null", '""', '"\\ud800"', '"a\\udfffb"', '"\\u0000"',
           '"\u00b2"', '"\u0661\u0662"', '{"\u00b2": 1}', '{"\u0661": 1}', '{"1": 1e999}',
           '{"' + "9" * 5000 + '": 1}', '{"99999999999": 1}', "[]", "{}", '["\\ud800"]', '[""]',
           '{"type": "json_schema", "schema": {"maximum": 36893488147419103232}}',
           '{"type": "json_schema", "schema": {"enum": ["\\ud800"]}}',
           '{"type": "json_schema", "schema": {"const": -9223372036854775808}}',
           '{"type": "regex", "pattern": "[0-9]+"}',
           '{"type": "json_object"}', '{"type": []}', '{"type": {"a": 1}}', '{"type": "text", "x": []}',
           '{"type": "grammar", "lark": "start: \\"a\\""}', '{"include_usage": 1}',
           '[{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]',
           '[{"role": "user", "content": [{"type": "image_url"}]}]',
           '[{"role": "user", "content": [{"type": "image", "source": {}}]}]',
           '[{"role": "assistant", "content": "x"}]', '[{"type": "function_call"}]',
           '[{"role": "developer", "content": [{"type": "input_text", "text": "\\ud800"}]}]',
           '{"format": {"type": "json_schema", "name": "a", "schema": {"type": 7}}}',
           '{"format": {"type": "json_object"}}', '[{"type": "text", "text": 1}]']
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20).map(json.dumps)
_nested = st.tuples(st.integers(1, 3000), st.sampled_from([("[", "]"), ('{"a": ', "}")])).map(
    lambda t: t[1][0] * t[0] + "1" + t[1][1] * t[0])
_huge = st.sampled_from([10**4, 10**6 + 1, 3 * 10**6]).map(lambda n: json.dumps("x" * n)) | \
    st.sampled_from([300, 5000, 100_000]).map(lambda n: "[" + ",".join(['"s"'] * n) + "]") | \
    st.sampled_from([301, 5000]).map(lambda n: json.dumps({str(i): 1 for i in range(n)}))
_message = st.tuples(st.sampled_from(['"user"', '"\\ud800"', "1", "null"]) | _json,
                     st.sampled_from(['"hi"', '"\\ud800"', "null", "[]"]) | _json).map(
    lambda rc: f'{{"role": {rc[0]}, "content": {rc[1]}}}')
_messages = st.lists(_message, min_size=0, max_size=4).map(lambda ms: "[" + ", ".join(ms) + "]")
RAW = st.sampled_from(SPECIAL) | _json | st.integers(-(2**70), 2**70).map(str) | _nested | _huge | _messages


def _body(base: dict[str, str], fields: dict[str, str]) -> str:
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in {**base, **fields}.items()) + "}"


@pytest.fixture(scope="module")
def http():
    with served_app() as client:
        yield client


def _check(http, path: str, fields: dict[str, str]) -> None:
    response = post(http, _body({**BASES, **ADMIN_BASES}[path], fields), path)
    allowed = {504} if "timeout" in fields else set()  # the client asked for a (tiny) deadline
    assert response.status_code < 500 or response.status_code in allowed, (fields, response.text[:500])
    if response.status_code >= 400:
        assert_error_shape(path, response.json())
    assert_still_serving(http)


FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(COMPLETION_FIELDS), RAW, min_size=1, max_size=4))
def test_fuzzed_completions_are_4xx_or_served(http, fields):
    _check(http, "/v1/completions", fields)


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(CHAT_FIELDS), RAW, min_size=1, max_size=4))
def test_fuzzed_chat_completions_are_4xx_or_served(http, fields):
    _check(http, "/v1/chat/completions", fields)


def assert_error_shape(path: str, body: dict) -> None:
    if path.startswith("/v1/messages"):
        assert set(body) == {"type", "error"} and set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(MESSAGES_FIELDS), RAW, min_size=1, max_size=4),
       path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]))
def test_fuzzed_anthropic_messages_are_4xx_or_served(http, fields, path):
    _check(http, path, fields)


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(RESPONSES_FIELDS), RAW, min_size=1, max_size=4))
def test_fuzzed_responses_are_4xx_or_served(http, fields):
    _check(http, "/v1/responses", fields)


@FUZZ
@given(raw=st.sampled_from(SPECIAL) | _json | _nested | st.binary(max_size=64).map(repr))
def test_fuzzed_whole_bodies_are_4xx(http, raw):
    for path in BASES:
        response = post(http, raw, path)
        assert 400 <= response.status_code < 500, (raw[:200], response.text[:500])
        assert_error_shape(path, response.json())
    assert_still_serving(http)


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(ADMIN_FIELDS), RAW, min_size=1, max_size=3),
       path=st.sampled_from(list(ADMIN_BASES)))
def test_fuzzed_admin_bodies_are_4xx_or_served(http, fields, path):
    _check(http, path, fields)


@FUZZ
@given(raw=st.sampled_from(SPECIAL) | _json | _nested | st.binary(max_size=64).map(repr))
def test_fuzzed_whole_admin_bodies_are_4xx_or_served(http, raw):
    for path in ADMIN_BASES:
        if path == "/admin/drain" and raw.lstrip().startswith("{"):
            continue  # a JSON object without the base's "worker" drains the whole pool
        response = post(http, raw, path)
        assert response.status_code < 500, (raw[:200], response.text[:500])
        if response.status_code >= 400:
            assert_error_shape(path, response.json())
    assert_still_serving(http)


# -- tool calling: each dialect's tools, tool_choice and tool history, valid and hostile parts --

def _raw(*texts: str) -> st.SearchStrategy[str]:
    """One of ``texts`` (raw JSON), or one time in eight any fuzzed value in its place (so that
    many bodies pass the checks and reach the pool and the stream writers)."""
    hostile = st.sampled_from(SPECIAL) | _json
    return st.integers(0, 7).flatmap(lambda i: hostile if i == 0 else st.sampled_from(texts))


_SCHEMA = _raw('{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}', "{}",
               '{"type": 7}', '{"type": "object", "properties": {"a": {"$ref": "#/nope"}}}',
               '{"type": "object", "properties": {"a": {"maximum": 36893488147419103232}}}')
_NAME = _raw('"get_weather"', '"add"', '"bad name"', '"' + "x" * 65 + '"', '"\\ud800"')
_ID = _raw('"call_1"', '"toolu_1"', '"\\ud800"', '""')
_ARGS = _raw('"{\\"a\\": 1}"', '"{}"', '"not json"', '{"a": 1}', '"{\\"a\\": \\"\\\\ud800\\"}"')
_PARALLEL = _raw("true", "false")


def _object(required: tuple[str, ...] = (), **parts: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A JSON object text of ``parts``, each field but the ``required`` ones sometimes left out."""
    fields = st.fixed_dictionaries({k: v for k, v in parts.items() if k in required},
                                   optional={k: v for k, v in parts.items() if k not in required})
    return fields.map(lambda d: "{" + ", ".join(f'"{k}": {v}' for k, v in d.items()) + "}")


def _list(item: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(item, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]")


_CHAT_TOOL = _object(("type", "function"), type=_raw('"function"', '"custom"'), function=_object(
    ("name",), name=_NAME, description=_raw('"d"'), parameters=_SCHEMA, strict=_raw("true", "false")))
_CHAT_CALL = _object(("id", "function"), id=_ID, type=_raw('"function"'),
                     function=_object(("name", "arguments"), name=_NAME, arguments=_ARGS))
_CHAT_HISTORY = st.tuples(_list(_CHAT_CALL), _ID, _raw('"18 C"', "null")).map(
    lambda t: '[{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": '
              f'{t[0]}}}, {{"role": "tool", "tool_call_id": {t[1]}, "content": {t[2]}}}]')
_FLAT_TOOL = _object(("type", "name"), type=_raw('"function"', '"web_search"'), name=_NAME,
                     description=_raw('"d"'), parameters=_SCHEMA, strict=_raw("true", "false"))
_ITEMS = st.lists(_object(("type", "call_id", "name", "arguments"), type=_raw('"function_call"'), call_id=_ID,
                          name=_NAME, arguments=_ARGS, status=_raw('"completed"'))
                  | _object(("type", "call_id", "output"), type=_raw('"function_call_output"', '"reasoning"'),
                            call_id=_ID, output=_raw('"18 C"', '[{"type": "input_text", "text": "x"}]'))
                  | _object(("role", "content"), role=_raw('"user"', '"assistant"'), content=_raw('"hi"')),
                  min_size=1, max_size=4).map(lambda items: "[" + ", ".join(items) + "]")
_CLAUDE_TOOL = _object(("name", "input_schema"), name=_NAME, description=_raw('"d"'), input_schema=_SCHEMA,
                       type=_raw('"custom"', '"bash_20250124"'))
_TEXT = _object(("type", "text"), type=_raw('"text"'), text=_raw('"hi"'))
_USE = _object(("type", "id", "name", "input"), type=_raw('"tool_use"'), id=_ID, name=_NAME,
               input=_raw('{"a": 1}'))
_RESULT = _object(("type", "tool_use_id"), type=_raw('"tool_result"'), tool_use_id=_ID, is_error=_raw("true"),
                  content=_raw('"18 C"', '[{"type": "text", "text": "x"}]'))
_CLAUDE_HISTORY = st.tuples(_list(_TEXT | _USE), _list(_RESULT | _TEXT)).map(
    lambda t: f'[{{"role": "user", "content": "hi"}}, {{"role": "assistant", "content": {t[0]}}}, '
              f'{{"role": "user", "content": {t[1]}}}]')
TOOL_FIELDS = {
    "/v1/chat/completions": {"tools": _list(_CHAT_TOOL), "messages": _CHAT_HISTORY,
                             "parallel_tool_calls": _PARALLEL,
                             "tool_choice": _raw('"auto"', '"none"', '"required"', '{"type": "function", '
                                                 '"function": {"name": "get_weather"}}'),
                             "functions": _raw("[]"), "stream": _raw("true")},
    "/v1/responses": {"tools": _list(_FLAT_TOOL), "input": _ITEMS, "parallel_tool_calls": _PARALLEL,
                      "tool_choice": _raw('"required"', '{"type": "function", "name": "get_weather"}',
                                          '{"type": "allowed_tools"}'), "stream": _raw("true")},
    "/v1/messages": {"tools": _list(_CLAUDE_TOOL), "messages": _CLAUDE_HISTORY, "stream": _raw("true"),
                     "tool_choice": _raw('{"type": "any"}', '{"type": "tool", "name": "get_weather"}',
                                         '{"type": "auto", "disable_parallel_tool_use": true}')}}


@FUZZ
@given(path=st.sampled_from(list(TOOL_FIELDS)), data=st.data())
def test_fuzzed_tool_requests_are_4xx_or_served(http, path, data):
    fields = data.draw(st.fixed_dictionaries({}, optional=TOOL_FIELDS[path]))
    _check(http, path, fields)
