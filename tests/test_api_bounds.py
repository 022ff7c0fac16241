"""Issue 24's HTTP findings, each a named regression test through the real Starlette app (a broker
and a null worker behind it): every hostile body is a 400 (413 for a body over the cap) naming the
field, never a 500 or a hang, and the next valid request still succeeds."""

from __future__ import annotations

import asyncio
import json

import pytest
from app_helpers import VALID, assert_still_serving, post, served_app
from starlette.exceptions import HTTPException
from starlette.requests import Request

from ovpool.api.body import read_json
from ovpool.api.schema import MAX_BODY_BYTES
from ovpool.bounds import MAX_JSON_DEPTH, MAX_PROMPT_CHARS

CHAT_PATH = "/v1/chat/completions"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
LONE = "\\ud800"  # a JSON escape json.loads accepts and UTF-8 (so msgpack) cannot encode
SCHEMA = '{"type": "json_schema", "json_schema": {"name": "x", "schema": %s}}'


@pytest.fixture(scope="module")
def http():
    with served_app() as client:
        yield client


def completion(**fields: str) -> str:
    """A valid completion body with ``fields`` set to raw JSON text."""
    return _raw(VALID, fields)


def chat(**fields: str) -> str:
    return _raw(CHAT, fields)


def _raw(base: dict, fields: dict[str, str]) -> str:
    kept = {k: json.dumps(v) for k, v in base.items() if k not in fields}
    return "{" + ", ".join(f'"{k}": {v}' for k, v in {**kept, **fields}.items()) + "}"


def refused(http, raw: str | bytes, path: str = "/v1/completions", status: int = 400) -> dict:
    """The error of ``raw`` (asserting its status and OpenAI's shape), after which the app still serves."""
    response = post(http, raw, path)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert_still_serving(http)
    return error


@pytest.mark.parametrize("raw, param", [
    (completion(max_tokens="18446744073709551616"), "max_tokens"),
    (completion(top_k="18446744073709551616"), "top_k"),
    (completion(seed="18446744073709551616"), "seed"),
    (completion(temperature="3"), "temperature"),
    (completion(temperature="NaN"), "temperature"),
    (completion(top_p="1e999"), "top_p"),
    (completion(prompt=f'"{LONE}"'), "prompt"),
    (completion(prompt=f'["ok", "{LONE}"]'), "prompt"),
    (completion(model=f'"{LONE}"'), "model"),
    (completion(stop=f'["{LONE}"]'), "stop"),
    (completion(stop=json.dumps(["s"] * 17)), "stop"),
    (completion(logit_bias='{"\u00b2": 1}'), "logit_bias"),
    (completion(logit_bias='{"%s": 1}' % ("1" * 5000)), "logit_bias"),
    (completion(logit_bias=json.dumps({str(i): 1 for i in range(301)})), "logit_bias"),
    (completion(response_format=SCHEMA % '{"type": "integer", "maximum": 36893488147419103232}'),
     "response_format"),
    (completion(response_format=SCHEMA % f'{{"type": "string", "enum": ["{LONE}"]}}'), "response_format"),
    (completion(response_format=SCHEMA % '{"enum": [-9223372036854775808]}'), "response_format"),  # segfault
    (completion(response_format=SCHEMA % ('{"items": ' * 70 + "{}" + "}" * 70)), "response_format"),
    (completion(n="128", max_tokens="4096"), "max_tokens"),
    (completion(n="32", max_tokens="4096", logprobs="20"), "logprobs"),
])
def test_hostile_completion_fields_are_400_naming_the_field(http, raw, param):
    assert refused(http, raw)["param"] == param


@pytest.mark.parametrize("raw, param", [
    (chat(messages=f'[{{"role": "user", "content": "{LONE}"}}]'), "messages[0].content"),
    (chat(messages=f'[{{"role": "user", "content": [{{"type": "text", "text": "{LONE}"}}]}}]'),
     "messages[0].content"),
    (chat(messages=f'[{{"role": "{LONE}", "content": "x"}}]'), "messages[0].role"),
    (chat(messages=f'[{{"role": "user", "name": "{LONE}", "content": "x"}}]'), "messages[0].name"),
    (chat(model=f'"{LONE}"'), "model"),
    (chat(max_completion_tokens="18446744073709551616"), "max_completion_tokens"),
    (chat(logprobs="true", top_logprobs="21"), "top_logprobs"),
])
def test_hostile_chat_fields_are_400_naming_the_field(http, raw, param):
    assert refused(http, raw, CHAT_PATH)["param"] == param


def test_deep_nesting_is_400_naming_the_field_not_a_recursion_error(http):
    deep = "[" * 100_000 + "]" * 100_000
    assert "nests more than" in refused(http, completion(extra=deep))["message"]
    within = "[" * 200 + "]" * 200  # parsed, then refused by the iterative check
    error = refused(http, completion(extra=within))
    assert error["param"] == "extra" and f"more than {MAX_JSON_DEPTH} levels" in error["message"]
    refused(http, deep, CHAT_PATH)


def test_an_integer_of_5000_digits_is_400(http):
    assert "not valid JSON" in refused(http, completion(max_tokens="9" * 5000))["message"]


def test_a_20_mb_prompt_is_400_at_once_not_requeued(http):
    error = refused(http, json.dumps({**VALID, "prompt": "x" * 20_000_000}))
    assert error["param"] == "prompt" and f"{MAX_PROMPT_CHARS:,}" in error["message"]
    body = {**CHAT, "messages": [{"role": "user", "content": "y" * (MAX_PROMPT_CHARS // 2 + 1)}] * 2}
    assert refused(http, json.dumps(body), CHAT_PATH)["param"] == "messages"


def test_a_body_over_the_cap_is_413(http):
    error = refused(http, b'{"prompt": "' + b"x" * MAX_BODY_BYTES + b'"}', status=413)
    assert error["code"] == 413 and "64 MiB" in error["message"]


def test_a_prompt_at_the_cap_is_served(http):
    response = post(http, {**VALID, "prompt": "x" * MAX_PROMPT_CHARS})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2


def test_a_client_gone_before_its_body_ended_is_counted_not_a_traceback(http):
    async def send_half_then_leave(app) -> list[dict]:
        messages = [{"type": "http.request", "body": b'{"model": ', "more_body": True},
                    {"type": "http.disconnect"}]
        sent: list[dict] = []

        async def receive() -> dict:
            return messages.pop(0)

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "root_path": "",
                 "scheme": "http", "query_string": b"", "http_version": "1.1",
                 "headers": [(b"content-type", b"application/json")],
                 "server": ("testserver", 80), "client": ("testclient", 1)}
        await app(scope, receive, send)  # an exception out of the app here is a traceback in the log
        return sent

    sent = http.portal.call(send_half_then_leave, http.app)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    assert 'ovpool_http_requests_total{endpoint="completions",status="499"}' in http.get("/metrics").text
    assert_still_serving(http)


@pytest.mark.parametrize("timeout", ["NaN", "-1", "1" + "0" * 400, "1e999", "-Infinity", "true", '"5"',
                                     "null"])
def test_an_admin_drains_timeout_must_be_a_finite_number_of_seconds(http, timeout):
    """NaN or -1 reached the broker as 0 (the whole pool drained at once); 10**400 was a 500."""
    error = refused(http, f'{{"timeout_s": {timeout}}}', "/admin/drain")
    assert error["param"] == "timeout_s" and "finite number of seconds >= 0" in error["message"]


@pytest.mark.parametrize("path", ["/admin/drain", "/v1/models/m/load", "/v1/models/m/unload"])
def test_an_admin_routes_body_is_none_or_a_json_object(http, path):
    for raw in ("[]", '"x"', "1", "{", "NaN"):
        refused(http, raw, path)


@pytest.mark.parametrize("timeout", ["nan", "-1", "inf", "1e400"])
def test_ovpool_drains_timeout_must_be_a_finite_number_of_seconds(timeout):
    from click.testing import CliRunner

    from ovpool.cli.drain import drain_command

    result = CliRunner().invoke(drain_command, ["--timeout", timeout, "--broker", "tcp://127.0.0.1:1"])
    assert result.exit_code == 2 and "finite number of seconds >= 0" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_body_declared_over_the_cap_is_413_before_any_of_it_is_read():
    async def receive() -> dict:
        raise AssertionError("the body was read")

    declared = [(b"content-length", str(MAX_BODY_BYTES + 1).encode())]
    with pytest.raises(HTTPException) as refused_early:
        asyncio.run(read_json(Request({"type": "http", "headers": declared}, receive)))
    assert refused_early.value.status_code == 413
