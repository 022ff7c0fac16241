"""Anthropic's /v1/messages (+ count_tokens), OpenAI's /v1/responses and /v1/models/{id}, driven by
the official anthropic and openai SDKs against the app in this process (app_helpers), in front of a
broker and a null worker: each answer equals the chat completion of the same messages (one core),
in its own API's shape, and each refusal is that API's error JSON naming the field.

The null backend's tokens are " t<id>", drawn from the prompt's text (each message's content
joined by newlines); each word is a prompt token, and every generation ends at max_tokens.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from app_helpers import served_app

pytestmark = pytest.mark.slow  # a broker and a worker process
KEY = "k1"
SYSTEM, USER = "be brief", "hello there"
SEED = {"seed": 7}  # ovpool's extension of both APIs, as in chat completions
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
ASK = {"model": "m", "system": SYSTEM, "messages": MESSAGES[1:]}  # MESSAGES, as Anthropic's API says them
ASKED = {"model": "m", "instructions": SYSTEM, "input": USER, "max_output_tokens": 5}  # as the Responses API


@pytest.fixture(scope="module")
def http():
    with served_app(keys=(KEY,)) as client:
        yield client


@pytest.fixture(scope="module")
def oai(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=http, max_retries=0)


@pytest.fixture(scope="module")
def claude(http):  # the anthropic SDK sends its key as x-api-key
    return anthropic.Anthropic(base_url="http://testserver", api_key=KEY, http_client=http, max_retries=0)


@pytest.fixture(scope="module")
def chat_text(oai):
    """The chat core's answer to MESSAGES in 5 tokens."""
    out = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=5, seed=7)
    return out.choices[0].message.content


def _events(http, path: str, body: dict, key_header: dict) -> list[tuple[str, dict]]:
    """A stream's (event name, data) pairs, from its raw bytes."""
    response = http.post(path, json=body, headers=key_header)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in response.text.split("\n\n") if f]
    pairs = [dict(line.split(": ", 1) for line in frame.split("\n")) for frame in frames]
    return [(p["event"], json.loads(p["data"])) for p in pairs]


def test_anthropic_message_is_the_chat_completion_in_anthropics_shape(claude, chat_text):
    out = claude.messages.create(**ASK, max_tokens=5, extra_body=SEED)
    assert [(b.type, b.text) for b in out.content] == [("text", chat_text)]
    assert (out.type, out.role, out.model, out.stop_reason, out.stop_sequence) == (
        "message", "assistant", "m", "max_tokens", None)
    assert (out.usage.input_tokens, out.usage.output_tokens) == (4, 5) and out.id.startswith("msg_")
    blocks = claude.messages.create(  # system and content as text blocks: the same prompt
        model="m", max_tokens=5, system=[{"type": "text", "text": SYSTEM}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "hello "},
                                                {"type": "text", "text": "there"}]}], extra_body=SEED)
    assert blocks.content[0].text == chat_text


def test_anthropic_stream_events_and_the_sdks_final_message(claude, http, chat_text):
    with claude.messages.stream(**ASK, max_tokens=5, extra_body=SEED) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == chat_text
    assert (final.stop_reason, final.usage.input_tokens, final.usage.output_tokens) == ("max_tokens", 4, 5)
    events = _events(http, "/v1/messages", {**ASK, **SEED, "max_tokens": 5, "stream": True},
                     {"x-api-key": KEY})
    assert [name for name, _ in events] == ["message_start", "content_block_start", "ping"] + \
        ["content_block_delta"] * 5 + ["content_block_stop", "message_delta", "message_stop"]
    assert all(name == data["type"] for name, data in events)
    assert events[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


def test_anthropic_count_tokens_is_the_prompts_token_count(claude):
    counted = claude.messages.count_tokens(**ASK)
    assert counted.input_tokens == 4


@pytest.mark.parametrize("change, param, words", [
    ({"max_tokens": None}, "max_tokens", "required"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]",
     "image blocks are not supported"),
    ({"tool_choice": {"type": "any"}}, "tool_choice", "only allowed when tools are given"),
    ({"stop_sequences": "END"}, "stop_sequences", "list of strings"),
    ({"stop_sequences": [""]}, "stop_sequences", "stop"),  # the core's check, named as Anthropic does
    ({"temperature": 1.5}, "temperature", "temperature"),
    ({"output_config": "json"}, "output_config", "object"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": 7}}}}, "output_config.format",
     "schema"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}, "messages[1]",
     "prefill"),
    ({"messages": [{"role": "system", "content": "a"}]}, "messages[0].role", "top-level system"),
])
def test_anthropic_refusals_are_its_error_json_naming_the_field(claude, change, param, words):
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": USER}], **change}
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.post("/v1/messages", body={k: v for k, v in body.items() if v is not None}, cast_to=object)
    error = info.value.body
    assert set(error) == {"type", "error"} and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error" and set(error["error"]) == {"type", "message"}
    assert error["error"]["message"].startswith(param + ":") and words in error["error"]["message"]


def test_anthropic_errors_of_the_pool_and_of_keys_keep_its_shape(http, claude):
    with pytest.raises(anthropic.NotFoundError) as info:
        claude.messages.create(model="absent", max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert info.value.body["error"]["type"] == "not_found_error"
    for headers in ({"x-api-key": "wrong"}, {}, {"authorization": "Bearer wrong"}):
        response = http.post("/v1/messages/count_tokens", json=ASK, headers=headers)
        assert response.status_code == 401, headers
        assert response.json()["error"]["type"] == "authentication_error"
    response = http.post("/v1/messages/nowhere", json={}, headers={"x-api-key": KEY})
    assert response.status_code == 404 and response.json()["type"] == "error"
    assert "no route /v1/messages/nowhere" in response.json()["error"]["message"]


def test_an_unknown_route_or_method_says_what_is_served(http):
    response = http.post("/v1/embeddings", json={"model": "m", "input": "x"}, headers={"x-api-key": KEY})
    message = response.json()["error"]["message"]
    assert response.status_code == 404 and "no route /v1/embeddings" in message
    assert "/v1/chat/completions" in message and "embeddings are not served" in message
    response = http.get("/v1/chat/completions", headers={"x-api-key": KEY})
    assert response.status_code == 405 and "does not take GET" in response.json()["error"]["message"]


def test_responses_is_the_chat_completion_in_the_responses_shape(oai, chat_text):
    out = oai.responses.create(**ASKED, extra_body=SEED)
    assert out.output_text == chat_text and out.object == "response" and out.id.startswith("resp_")
    assert (out.status, out.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert (out.usage.input_tokens, out.usage.output_tokens, out.usage.total_tokens) == (4, 5, 9)
    (item,) = out.output
    assert (item.type, item.role, item.content[0].type) == ("message", "assistant", "output_text")
    items = oai.responses.create(model="m", max_output_tokens=5, input=[
        {"role": "developer", "content": SYSTEM},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": USER}]},
    ], extra_body=SEED)
    assert items.output_text == chat_text


def test_responses_stream_has_the_typed_events_in_order(oai, chat_text):
    events = list(oai.responses.create(**ASKED, stream=True, extra_body=SEED))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 5, "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.incomplete"]  # max_output_tokens reached
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == chat_text
    assert events[-4].text == chat_text and events[-1].response.output_text == chat_text
    assert events[-1].response.usage.output_tokens == 5


def test_responses_stream_helper_accumulates_the_events(oai, chat_text):
    """The SDK's stream helper checks that every event names the same response and item."""
    with oai.responses.stream(**ASKED, extra_body=SEED) as stream:
        events = list(stream)
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas[-1].snapshot == chat_text and events[-1].type == "response.incomplete"
    assert events[-1].response.output[0].content[0].text == chat_text


def test_responses_text_format_json_schema_reaches_the_core(oai):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    out = oai.responses.create(model="m", input="x", max_output_tokens=2, text={"format": {
        "type": "json_schema", "name": "answer", "schema": schema, "strict": True}})
    assert out.status == "incomplete"  # the null worker ignores the grammar; the engine test holds it
    with pytest.raises(openai.BadRequestError) as info:
        oai.responses.create(model="m", input="x", text={"format": {"type": "json_schema", "name": "a",
                                                                    "schema": {"type": 7}}})
    assert info.value.body["param"] == "text.format"


@pytest.mark.parametrize("change, param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format"),
])
def test_responses_refusals_name_the_field(oai, change, param):
    with pytest.raises(openai.BadRequestError) as info:
        oai.post("/responses", body={"model": "m", "input": "x", **change}, cast_to=object)
    assert info.value.body["param"] == param and info.value.body["type"] == "invalid_request_error"
    assert info.value.body["message"].startswith(param + ":")


def test_models_retrieve_and_its_404(oai):
    model = oai.models.retrieve("m")
    assert (model.id, model.object, model.owned_by, model.capabilities) == (
        "m", "model", "ovpool", ["chat", "completion"])
    assert [m.capabilities for m in oai.models.list().data] == [["chat", "completion"]]
    with pytest.raises(openai.NotFoundError) as info:
        oai.models.retrieve("org/absent")
    assert info.value.code == "model_not_found" and "org/absent" in info.value.message


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
TOOL_G = {"type": "function", "function": {"name": "g"}}


def test_tool_calls_cross_the_broker_in_every_dialect(oai, claude):
    """The null worker calls the tools ("{}" in pieces): the calls' pieces (PARTIALs) and the
    FINAL's calls cross the broker, and each SDK's stream helper assembles what create returns."""
    ask = {"model": "m", "messages": MESSAGES, "tools": [TOOL, TOOL_G], "tool_choice": "required",
           "max_tokens": 8}
    whole = oai.chat.completions.create(**ask).choices[0]
    with oai.chat.completions.stream(**ask) as stream:
        streamed = stream.get_final_completion().choices[0]
    for out in (whole, streamed):
        assert out.finish_reason == "tool_calls"
        assert [(t.function.name, t.function.arguments) for t in out.message.tool_calls] == [("f", "{}"),
                                                                                            ("g", "{}")]
    flat = [{"type": "function", "name": "f", "parameters": TOOL["function"]["parameters"]}]
    with oai.responses.stream(model="m", input=USER, tools=flat, tool_choice="required") as stream:
        final = stream.get_final_response()
    assert [(i.type, i.name, i.arguments) for i in final.output] == [("function_call", "f", "{}")]
    with claude.messages.stream(model="m", max_tokens=8, messages=MESSAGES[1:], tools=[
            {"name": "f", "input_schema": {"type": "object"}}], tool_choice={"type": "any"}) as stream:
        message = stream.get_final_message()
    assert [(b.type, b.name, b.input) for b in message.content] == [("tool_use", "f", {})]
    assert message.stop_reason == "tool_use"
