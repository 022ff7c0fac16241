"""Tool calling through the HTTP API's three dialects, driven by the official openai and anthropic
SDKs (their stream helpers too) against the app in this process, in front of a scripted pool
(tool_pool.py): each dialect's tools reach the core as the same canonical SamplingParams and
messages, and the core's calls come back in each API's shape, streamed or not, alike.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from tool_pool import ARGUMENTS, PREAMBLE, ScriptedClient, scripted_app

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                  "required": ["city", "unit"], "additionalProperties": False}
ADD_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER_SCHEMA, "strict": True}},
         {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": ADD_SCHEMA}}]
CANONICAL = [{"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER_SCHEMA,
              "strict": True},
             {"name": "add", "description": "a + b", "parameters": ADD_SCHEMA, "strict": False}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER_ARGS = ARGUMENTS["get_weather"]


@pytest.fixture(scope="module")
def http():
    with scripted_app() as client:
        yield client


@pytest.fixture(scope="module")
def oai(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


@pytest.fixture(scope="module")
def claude(http):
    return anthropic.Anthropic(base_url="http://testserver", api_key="x", http_client=http, max_retries=0)


def _last_request():
    return ScriptedClient.requests[-1]


def _sse(http, path: str, body: dict) -> list[dict]:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return [json.loads(line.removeprefix("data: ")) for line in response.text.split("\n")
            if line.startswith("data: ") and line != "data: [DONE]"]


# -- chat completions ---------------------------------------------------------------------------


@pytest.mark.parametrize("choice, parallel, names", [
    ("required", False, ["get_weather"]),
    ("required", None, ["get_weather", "add"]),  # parallel calls by default: one per tool here
    ({"type": "function", "function": {"name": "add"}}, None, ["add"]),
])
def test_chat_tool_choice_required_and_named_reply_with_calls_only(oai, choice, parallel, names):
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    out = oai.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=choice, **extra)
    (c,) = out.choices
    assert (c.finish_reason, c.message.content, c.message.role) == ("tool_calls", None, "assistant")
    assert [(t.type, t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls] == [
        ("function", n, ARGUMENTS[n]) for n in names]
    assert len({t.id for t in c.message.tool_calls}) == len(names)
    _, params = _last_request()
    assert params.tools == CANONICAL and params.parallel_tool_calls is (parallel is not False)
    assert params.tool_choice == (choice if isinstance(choice, str) else {"name": "add"})


def test_chat_tool_choice_auto_has_text_before_its_call_and_none_has_no_call(oai):
    auto = oai.chat.completions.create(model="m", messages=ASK, tools=TOOLS).choices[0]
    assert auto.message.content == PREAMBLE and auto.finish_reason == "tool_calls"
    assert [t.function.name for t in auto.message.tool_calls] == ["get_weather"]
    assert _last_request()[1].tool_choice == "auto"
    none = oai.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="none").choices[0]
    assert (none.message.content, none.message.tool_calls, none.finish_reason) == (
        "result: none", None, "stop")


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_chat_stream_helper_assembles_the_calls_of_the_whole_reply(oai, choice):
    whole = oai.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=choice)
    with oai.chat.completions.stream(model="m", messages=ASK, tools=TOOLS, tool_choice=choice) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    message, expected = final.choices[0].message, whole.choices[0].message
    assert (message.content, final.choices[0].finish_reason) == (expected.content, "tool_calls")
    assert [(t.id, t.function.name, t.function.arguments) for t in message.tool_calls] == [
        (t.id, t.function.name, t.function.arguments) for t in expected.tool_calls]
    done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert [(e.name, e.parsed_arguments) for e in done][0] == ("get_weather", WEATHER_ARGS)  # strict: parsed


def test_chat_stream_chunks_carry_each_calls_id_and_name_once_then_fragments(http):
    chunks = _sse(http, "/v1/chat/completions", {"model": "m", "messages": ASK, "tools": TOOLS,
                                                 "tool_choice": "required", "stream": True})
    pieces = [p for c in chunks for p in c["choices"][0]["delta"].get("tool_calls", [])]
    firsts = [p for p in pieces if "id" in p]
    assert [(p["index"], p["type"], p["function"]) for p in firsts] == [
        (0, "function", {"name": "get_weather", "arguments": ""}),
        (1, "function", {"name": "add", "arguments": ""})]
    assert all(set(p) == {"index", "function"} and set(p["function"]) == {"arguments"}
               for p in pieces if "id" not in p)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None,
                                                "tool_calls": [firsts[0]]}
    joined = "".join(p["function"]["arguments"] for p in pieces if p["index"] == 0)
    assert json.loads(joined) == WEATHER_ARGS and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_chat_round_trip_the_tool_result_reaches_the_model(oai):
    first = oai.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                        parallel_tool_calls=False).choices[0].message
    call = first.tool_calls[0]
    history = [*ASK, first.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    final = oai.chat.completions.create(model="m", messages=history, tools=TOOLS).choices[0]
    assert (final.message.content, final.finish_reason) == ("result: 18 C and sunny", "stop")
    prompt, _ = _last_request()
    assert prompt[1:] == [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "get_weather",
                                                          "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]


@pytest.mark.parametrize("change, param, words", [
    ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools", "only function tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", "tools[0].name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}]}, "tools",
     "tools[0].parameters"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "must be one of"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not among the tools"),
    ({"tool_choice": "required"}, "tool_choice", "only allowed when tools are given"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format", "tools"),
    ({"functions": [{"name": "f"}]}, "functions", "legacy"),
    ({"messages": [{"role": "function", "name": "f", "content": "1"}]}, "messages[0].role", "legacy"),
    ({"messages": [{"role": "tool", "content": "1"}]}, "messages[0].tool_call_id", "must be a string"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": "f"}, *ASK]},
     "messages[0].tool_calls", "list"),
    ({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}, *ASK]},
     "messages[0].tool_calls[0].function.arguments", "must be a string"),
])
def test_chat_tool_refusals_name_the_field(oai, change, param, words):
    with pytest.raises(openai.BadRequestError) as info:
        oai.post("/chat/completions", body={"model": "m", "messages": ASK, **change}, cast_to=object)
    assert info.value.body["param"] == param and words in info.value.body["message"]


# -- responses ----------------------------------------------------------------------------------

FLAT = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
         "parameters": t["function"]["parameters"], "strict": t["function"].get("strict", False)}
        for t in TOOLS]


def test_responses_function_call_items_and_the_echoed_tools(oai):
    out = oai.responses.create(model="m", input="Weather in Paris?", tools=FLAT, tool_choice="required",
                               parallel_tool_calls=False)
    (item,) = out.output
    assert (item.type, item.name, json.loads(item.arguments), item.status) == (
        "function_call", "get_weather", WEATHER_ARGS, "completed")
    assert item.call_id.startswith("call_") and item.id.startswith("fc_") and out.status == "completed"
    assert [t.name for t in out.tools] == ["get_weather", "add"] and out.tool_choice == "required"
    assert out.parallel_tool_calls is False and _last_request()[1].tools == CANONICAL
    auto = oai.responses.create(model="m", input="Weather in Paris?", tools=FLAT,
                                tool_choice={"type": "function", "name": "add"})
    assert [i.type for i in auto.output] == ["function_call"] and auto.output[0].name == "add"
    assert auto.tool_choice.name == "add"


def test_responses_stream_helper_assembles_the_same_output(oai):
    whole = oai.responses.create(model="m", input="Weather in Paris?", tools=FLAT)
    with oai.responses.stream(model="m", input="Weather in Paris?", tools=FLAT) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [(i.type, getattr(i, "call_id", None)) for i in final.output] == [
        (i.type, getattr(i, "call_id", None)) for i in whole.output] == [("message", None),
                                                                        ("function_call", "call_" + "0" * 24)]
    assert final.output_text == whole.output_text == PREAMBLE
    assert final.output[1].arguments == whole.output[1].arguments
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[4:8] == ["response.output_text.delta"] * 3 + ["response.output_text.done"]
    assert kinds[10:] == ["response.output_item.added", *["response.function_call_arguments.delta"] * 9,
                          "response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    args_done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(args_done.arguments) == WEATHER_ARGS and args_done.output_index == 1
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_round_trip_with_function_call_output(oai):
    out = oai.responses.create(model="m", input="Weather in Paris?", tools=FLAT, tool_choice="required",
                               parallel_tool_calls=False)
    call = out.output[0]
    history = [{"role": "user", "content": "Weather in Paris?"}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}]
    final = oai.responses.create(model="m", input=history, tools=FLAT)
    assert final.output_text == "result: 18 C"
    prompt, _ = _last_request()
    assert prompt[1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "18 C"}]


@pytest.mark.parametrize("change, param", [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": FLAT, "tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice"),
    ({"tools": FLAT, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "call_id": 1, "name": "f", "arguments": "{}"}]},
     "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}] * 4097}]},
     "input[0].content"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
])
def test_responses_tool_refusals_name_the_field(oai, change, param):
    with pytest.raises(openai.BadRequestError) as info:
        oai.post("/responses", body={"model": "m", "input": "x", **change}, cast_to=object)
    message = info.value.body["message"]
    assert info.value.body["param"] == param and message.startswith(param + ":")
    assert message.count(":") == 1 or not message.split(":", 2)[1].strip().startswith("max_tokens")


# -- anthropic messages -------------------------------------------------------------------------

CLAUDE_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                 "input_schema": t["function"]["parameters"]} for t in TOOLS]


def test_anthropic_tool_use_blocks_and_stop_reason(claude):
    out = claude.messages.create(model="m", max_tokens=50, messages=ASK, tools=CLAUDE_TOOLS,
                                 tool_choice={"type": "any", "disable_parallel_tool_use": True})
    (block,) = out.content
    assert (block.type, block.name, block.input, out.stop_reason) == ("tool_use", "get_weather", WEATHER_ARGS,
                                                                      "tool_use")
    assert block.id.startswith("toolu_")
    _, params = _last_request()
    assert (params.tool_choice, params.parallel_tool_calls) == ("required", False)
    assert [t["name"] for t in params.tools] == ["get_weather", "add"]
    auto = claude.messages.create(model="m", max_tokens=50, messages=ASK, tools=CLAUDE_TOOLS)
    assert [b.type for b in auto.content] == ["text", "tool_use"] and auto.content[0].text == PREAMBLE
    named = claude.messages.create(model="m", max_tokens=50, messages=ASK, tools=CLAUDE_TOOLS,
                                   tool_choice={"type": "tool", "name": "add"})
    assert [(b.name, b.input) for b in named.content] == [("add", ARGUMENTS["add"])]
    none = claude.messages.create(model="m", max_tokens=50, messages=ASK, tools=CLAUDE_TOOLS,
                                  tool_choice={"type": "none"})
    assert [b.type for b in none.content] == ["text"] and none.stop_reason == "end_turn"


def test_anthropic_stream_accumulates_the_same_blocks(claude, http):
    whole = claude.messages.create(model="m", max_tokens=50, messages=ASK, tools=CLAUDE_TOOLS)
    with claude.messages.stream(model="m", max_tokens=50, messages=ASK, tools=CLAUDE_TOOLS) as stream:
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == "tool_use"
    response = http.post("/v1/messages", json={"model": "m", "max_tokens": 50, "messages": ASK,
                                               "tools": CLAUDE_TOOLS, "stream": True})
    events = [json.loads(line[6:]) for line in response.text.split("\n") if line.startswith("data: ")]
    starts = [(e["index"], e["content_block"]["type"]) for e in events if e["type"] == "content_block_start"]
    assert starts == [(0, "text"), (1, "tool_use")]
    assert [e["type"] for e in events][:3] == ["message_start", "content_block_start", "ping"]
    fragments = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"
                 and e["delta"]["type"] == "input_json_delta"]
    assert len(fragments) > 1 and json.loads("".join(fragments)) == WEATHER_ARGS


def test_anthropic_round_trip_with_tool_result(claude):
    first = claude.messages.create(model="m", max_tokens=50, messages=ASK, tools=CLAUDE_TOOLS,
                                   tool_choice={"type": "tool", "name": "get_weather"})
    use = first.content[0]
    history = [*ASK, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": [{"type": "text", "text": "18 C"}]}]}]
    final = claude.messages.create(model="m", max_tokens=50, messages=history, tools=CLAUDE_TOOLS)
    assert [(b.type, b.text) for b in final.content] == [("text", "result: 18 C")]
    prompt, _ = _last_request()
    assert prompt[1:] == [
        {"role": "assistant", "content": None, "tool_calls": [{"id": use.id, "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps(WEATHER_ARGS)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "18 C"}]
    with claude.messages.stream(model="m", max_tokens=50, messages=history, tools=CLAUDE_TOOLS) as stream:
        assert "".join(stream.text_stream) == "result: 18 C"
    assert claude.messages.count_tokens(model="m", messages=history, tools=CLAUDE_TOOLS).input_tokens == 3


@pytest.mark.parametrize("change, param, words", [
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type", "server tool"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema", "required"),
    ({"tools": [{"name": "f", "input_schema": {"type": 7}}]}, "tools", "tools[0].input_schema"),
    ({"tools": CLAUDE_TOOLS, "tool_choice": {"type": "sometimes"}}, "tool_choice", "must be"),
    ({"tools": CLAUDE_TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice", "not among"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
     "messages[0].content[0]", "assistant message"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 3}]}]},
     "messages[0].content[0].tool_use_id", "string"),
])
def test_anthropic_tool_refusals_name_the_field(claude, change, param, words):
    body = {"model": "m", "max_tokens": 5, "messages": ASK, **change}
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.post("/v1/messages", body=body, cast_to=object)
    message = info.value.body["error"]["message"]
    assert message.startswith(param) and words in message


def test_chat_parse_helper_turns_strict_calls_into_pydantic_objects(oai):
    from typing import Literal

    from pydantic import BaseModel

    class GetWeather(BaseModel):
        city: str
        unit: Literal["celsius", "fahrenheit"]

    tool = openai.pydantic_function_tool(GetWeather, name="get_weather")
    out = oai.chat.completions.parse(model="m", messages=ASK, tools=[tool], tool_choice="required")
    (call,) = out.choices[0].message.tool_calls
    assert call.function.parsed_arguments == GetWeather(**WEATHER_ARGS)
    assert _last_request()[1].tools[0]["strict"] is True
