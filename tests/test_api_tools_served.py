"""Tool calling end to end: `ovpool serve --http` with SmolLM2 (the generic family: its template
has no tools section) and with a tiny qwen2 model whose template has one (the hermes family:
``<tool_call>`` markers), driven by the official openai and anthropic SDKs and, on SmolLM2, by a
LangChain agent, unchanged. Every call the server emits names a declared tool and its arguments
validate against that tool's schema (jsonschema); a tool's result reaches the model and the
conversation goes on. Greedy throughout, so each run asks the same; what the models answer is not
asserted beyond the shapes the grammar holds them to.
"""

from __future__ import annotations

import functools
import json
import operator

import anthropic
import jsonschema
import openai
import pytest
from serve_helpers import serve

from ovpool.testing.tiny_vocab import QWEN_TOOLS_TEMPLATE

pytestmark = pytest.mark.slow
SLOW_ENV = {"OVPOOL_HEARTBEAT_INTERVAL_S": "1.0"}  # a compiling worker may miss a 0.2 s heartbeat
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
           "required": ["city"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 1000},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 1000}},
       "required": ["a", "b"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER, "strict": True}},
         {"type": "function", "function": {"name": "add", "description": "The sum of two integers",
                                           "parameters": ADD, "strict": True}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0, "max_tokens": 60}


@pytest.fixture(scope="module")
def served(tmp_path_factory, smollm2_path):
    tmp = tmp_path_factory.mktemp("api-tools")
    with serve(tmp, "--model", str(smollm2_path), "--served-name", "smol", "--workers", "1", "--slots", "4",
               "--cache-dir", str(tmp / "cache"), "--set", "warm_up=load", env=SLOW_ENV, http=True) as s:
        s.wait_states("ready", timeout=300)
        s.base = f"http://127.0.0.1:{s.http_port}"
        s.sdk = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=120)
        yield s


def _valid(name: str, arguments: str | dict) -> dict:
    """The call's arguments, checked against its tool's schema."""
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(value, SCHEMAS[name])
    return value


@pytest.mark.parametrize("choice, names", [
    ("required", None), ({"type": "function", "function": {"name": "add"}}, ["add"])])
def test_chat_required_and_named_calls_validate_streamed_or_not(served, choice, names):
    out = served.sdk.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice=choice,
                                             parallel_tool_calls=False, **GREEDY).choices[0]
    (call,) = out.message.tool_calls
    assert out.finish_reason == "tool_calls" and call.function.name in (names or SCHEMAS)
    _valid(call.function.name, call.function.arguments)
    with served.sdk.chat.completions.stream(model="smol", messages=ASK, tools=TOOLS, tool_choice=choice,
                                            parallel_tool_calls=False, **GREEDY) as stream:
        final = stream.get_final_completion().choices[0]
    assert [(t.function.name, t.function.arguments) for t in final.message.tool_calls] == [
        (call.function.name, call.function.arguments)]
    assert final.finish_reason == "tool_calls"


def test_chat_auto_and_none_and_a_round_trip(served):
    none = served.sdk.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice="none",
                                              **GREEDY).choices[0]
    assert none.message.tool_calls is None and none.message.content
    auto = served.sdk.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, **GREEDY).choices[0]
    for call in auto.message.tool_calls or ():
        _valid(call.function.name, call.function.arguments)
    assert auto.finish_reason in ("tool_calls", "stop")
    first = served.sdk.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice={
        "type": "function", "function": {"name": "get_weather"}}, **GREEDY).choices[0].message
    history = [*ASK, first.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "Sunny, 18 C"}]
    final = served.sdk.chat.completions.create(model="smol", messages=history, tools=TOOLS,
                                               tool_choice="none", **GREEDY).choices[0]
    assert final.message.content and final.message.tool_calls is None


def test_responses_function_call_streamed_and_not(served):
    flat = [{"type": "function", **t["function"]} for t in TOOLS]
    ask = {"model": "smol", "input": ASK[0]["content"], "tools": flat, "tool_choice": "required",
           "temperature": 0, "max_output_tokens": 60}
    out = served.sdk.responses.create(**ask)
    calls = [i for i in out.output if i.type == "function_call"]
    assert calls and all(_valid(c.name, c.arguments) is not None for c in calls)
    with served.sdk.responses.stream(**ask) as stream:
        final = stream.get_final_response()
    assert [(i.name, i.arguments) for i in final.output if i.type == "function_call"] == [
        (c.name, c.arguments) for c in calls]
    history = [ASK[0], *[c.model_dump(exclude_none=True) for c in calls],
               *[{"type": "function_call_output", "call_id": c.call_id, "output": "18"} for c in calls]]
    answer = served.sdk.responses.create(model="smol", input=history, tools=flat, tool_choice="none",
                                         temperature=0, max_output_tokens=30)
    assert answer.output_text


def test_anthropic_tool_use_and_tool_result_streamed_and_not(served):
    claude = anthropic.Anthropic(base_url=served.base, api_key="none", max_retries=0, timeout=120)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    # This anthropic SDK takes no temperature argument: ovpool's greedy is sent as an extra field.
    ask = {"model": "smol", "max_tokens": 60, "extra_body": {"temperature": 0}, "messages": ASK,
           "tools": tools}
    one = {"type": "any", "disable_parallel_tool_use": True}
    out = claude.messages.create(**ask, tool_choice=one)
    uses = [b for b in out.content if b.type == "tool_use"]
    assert out.stop_reason == "tool_use" and len(uses) == 1 and uses[0].id.startswith("toolu_")
    _valid(uses[0].name, uses[0].input)
    with claude.messages.stream(**ask, tool_choice=one) as stream:
        final = stream.get_final_message()
    streamed = [(b.name, b.input) for b in final.content if b.type == "tool_use"]
    assert streamed == [(uses[0].name, uses[0].input)]
    result = {"type": "tool_result", "tool_use_id": uses[0].id, "content": "18"}
    history = [*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in out.content]},
               {"role": "user", "content": [result]}]
    answer = claude.messages.create(**{**ask, "messages": history}, tool_choice={"type": "none"})
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].text


def test_a_langchain_agent_completes_a_two_tool_task(served):
    """LangChain's ChatOpenAI.bind_tools and its tool loop, unchanged: the model is made to call a
    tool on each of the first two turns (SmolLM2 seldom calls on its own), each tool runs on the
    arguments it chose, and the third turn answers from both results."""
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langchain_openai import ChatOpenAI

    ran: list[tuple[str, dict]] = []

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(("get_weather", {"city": city}))
        return f"Sunny, 18 C in {city}"

    @tool
    def add(a: int, b: int) -> int:
        """The sum of two integers."""
        ran.append(("add", {"a": a, "b": b}))
        return a + b

    llm = ChatOpenAI(model="smol", base_url=served.base + "/v1", api_key="none", temperature=0, max_tokens=60,
                     max_retries=0, timeout=120)
    tools = {"get_weather": get_weather, "add": add}
    messages = [HumanMessage("What is the weather in Paris, and what is 2 + 3?")]
    for name, stream in (("get_weather", False), ("add", True)):
        bound = llm.bind_tools(list(tools.values()), tool_choice=name, parallel_tool_calls=False)
        reply = functools.reduce(operator.add, bound.stream(messages)) if stream else bound.invoke(messages)
        assert [c["name"] for c in reply.tool_calls] == [name]
        messages.append(reply)
        messages.extend(tools[c["name"]].invoke(c) for c in reply.tool_calls)  # ToolMessages
    answer = llm.bind_tools(list(tools.values())).invoke(messages, tool_choice="none")
    assert [n for n, _ in ran] == ["get_weather", "add"] and answer.content and not answer.tool_calls
    for name, args in ran:
        jsonschema.validate(args, convert_to_openai_tool(tools[name])["function"]["parameters"])


@pytest.fixture(scope="module")
def hermes(tmp_path_factory, tiny_model):
    """A random tiny qwen2 with a tools template: what it calls is the grammar's doing alone."""
    path = tiny_model(arch="qwen2", weight_type="F16", context_length=2048, chat_template=QWEN_TOOLS_TEMPLATE)
    tmp = tmp_path_factory.mktemp("api-tools-hermes")
    with serve(tmp, "--model", str(path), "--served-name", "tiny", "--workers", "1", "--slots", "4",
               "--cache-dir", str(tmp / "cache"), env=SLOW_ENV, http=True) as s:
        s.wait_states("ready", timeout=300)
        s.base = f"http://127.0.0.1:{s.http_port}"
        s.sdk = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=120)
        yield s


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_hermes_family_calls_validate_streamed_or_not(hermes, choice):
    ask = {"model": "tiny", "messages": ASK, "tools": TOOLS, "tool_choice": choice, "temperature": 0,
           "max_tokens": 120, "parallel_tool_calls": False}
    out = hermes.sdk.chat.completions.create(**ask).choices[0]
    assert out.finish_reason == "tool_calls" and out.message.tool_calls
    for call in out.message.tool_calls:
        _valid(call.function.name, call.function.arguments)
    with hermes.sdk.chat.completions.stream(**ask) as stream:
        final = stream.get_final_completion().choices[0]
    assert [(t.function.name, t.function.arguments) for t in final.message.tool_calls] == [
        (t.function.name, t.function.arguments) for t in out.message.tool_calls]
    assert final.message.content == out.message.content


def test_hermes_family_through_responses_and_anthropic(hermes):
    flat = [{"type": "function", **t["function"]} for t in TOOLS]
    with hermes.sdk.responses.stream(model="tiny", input=ASK[0]["content"], tools=flat, temperature=0,
                                     tool_choice="required", parallel_tool_calls=False,
                                     max_output_tokens=120) as stream:
        final = stream.get_final_response()
    calls = [i for i in final.output if i.type == "function_call"]
    assert calls and final.status == "completed"
    for c in calls:
        _valid(c.name, c.arguments)
    claude = anthropic.Anthropic(base_url=hermes.base, api_key="none", max_retries=0, timeout=120)
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
    one = {"type": "any", "disable_parallel_tool_use": True}
    with claude.messages.stream(model="tiny", max_tokens=120, extra_body={"temperature": 0}, messages=ASK,
                                tools=tools, tool_choice=one) as stream:
        message = stream.get_final_message()
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses and message.stop_reason == "tool_use"
    for use in uses:
        _valid(use.name, use.input)
