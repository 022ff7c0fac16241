"""Tool calls a worker makes: on tiny models of the three template families (qwen-style and
llama-3.1-style templates with a tools section, and ChatML without one) and on SmolLM2, every
call names a declared function and its arguments validate against that function's schema
(jsonschema), for hypothesis-generated schemas, greedy and seeded, alone and 8 batched; the
streamed pieces join to the final calls."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.testing.tiny_vocab import LLAMA3_TOOLS_TEMPLATE, QWEN_TOOLS_TEMPLATE
from ovpool.worker.backend import EngineBackend, Finished
from ovpool.worker.text import tool_format

F32 = {"inference_precision": "f32", "kv_cache_precision": "f32", "prefill_chunk": 16, "attention": "paged"}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tools."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                                    "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                   "required": ["a", "b"]}}}
CHOICES = ("auto", "required", {"type": "function", "function": {"name": "add"}})

# Bounded leaves, so that even a random model's calls end within max_tokens.
LEAVES = st.sampled_from([
    {"type": "string", "maxLength": 6}, {"type": "integer", "minimum": -5, "maximum": 500},
    {"type": "number", "minimum": 0, "maximum": 10}, {"type": "boolean"},
    {"enum": ["red", "green", "blue"]}, {"type": "string", "pattern": "^[a-z]{2,4}$"},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3},
])
NAMES = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)


def objects(leaf) -> st.SearchStrategy:
    return st.dictionaries(NAMES, leaf, min_size=0, max_size=3).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)) if props else st.nothing(), unique=True,
                               max_size=len(props)).map(
            lambda required: {"type": "object", "properties": props, "required": required}))


SCHEMAS = objects(st.one_of(LEAVES, objects(LEAVES)))
TOOLSETS = st.lists(st.tuples(st.sampled_from(["f", "lookup", "send-mail", "x_1"]), SCHEMAS),
                    min_size=1, max_size=3, unique_by=lambda t: t[0])


def as_tools(pairs) -> list[dict]:
    return [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in pairs]


def assert_valid(completion, tools: list[dict], params: SamplingParams) -> None:
    """Every call names a declared tool (the chosen one) and validates against its schema."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for call in completion.tool_calls:
        assert call.name in schemas, call
        if isinstance(params.tool_choice, dict):
            assert call.name == params.tool_choice["name"]
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])
        assert call.id.startswith("call_")
    if not params.parallel_tool_calls:
        assert len(completion.tool_calls) <= 1
    if completion.finish_reason == "tool_calls":
        assert completion.tool_calls
    elif completion.finish_reason == "stop" and params.tool_choice != "auto":
        pytest.fail(f"a reply that must call stopped without calls: {completion}")


def joined(deltas) -> dict[int, tuple[str, str, str]]:
    """Each call's id, name and arguments as its streamed pieces write them."""
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for piece in d.tool_calls:
            if piece.id:
                assert piece.index == len(calls) and not piece.arguments
                calls[piece.index] = [piece.id, piece.name, ""]
            else:
                calls[piece.index][2] += piece.arguments
    return {i: tuple(c) for i, c in calls.items()}


TEMPLATES = {"hermes": ("qwen2", QWEN_TOOLS_TEMPLATE), "llama3": ("llama", LLAMA3_TOOLS_TEMPLATE)}


@pytest.fixture(scope="module", params=["hermes", "llama3", "generic"])
def tiny(request, tiny_model):
    """A tiny engine of each family: qwen2 and llama with tools templates, llama with plain ChatML."""
    arch, template = TEMPLATES.get(request.param, ("llama", None))
    spec = {"chat_template": template} if template else {}
    path = tiny_model(arch=arch, weight_type="F16", context_length=2048, **spec)
    with Engine(path, settings=F32) as engine:
        assert engine.intake.tool_family == request.param
        yield engine


def test_the_family_is_read_from_the_template(smollm2_path):
    assert tool_format.family(QWEN_TOOLS_TEMPLATE) == "hermes"
    assert tool_format.family(LLAMA3_TOOLS_TEMPLATE) == "llama3"
    assert tool_format.family("{{ messages }}") == tool_format.family(None) == "generic"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=TOOLSETS, choice=st.sampled_from(["auto", "required", "named"]),
       parallel=st.booleans(), seed=st.one_of(st.none(), st.integers(0, 2**16)))
def test_every_call_is_declared_and_valid_alone(tiny, pairs, choice, parallel, seed):
    tools = as_tools(pairs)
    if choice == "named":
        choice = {"type": "function", "function": {"name": pairs[-1][0]}}
    sampling = {"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel, "max_tokens": 96}
    sampling |= {"temperature": 0.9, "seed": seed} if seed is not None else {}
    params = SamplingParams(**sampling)
    deltas = list(tiny.stream(ASK, **sampling))
    completion = tiny.chat(ASK, **sampling)
    assert_valid(completion, tools, params)
    streamed = joined(deltas)
    assert "".join(d.text for d in deltas) == completion.text
    # The same tokens (greedy, or the same seed): the pieces join to the final calls.
    assert [c[1:] for c in streamed.values()][:len(completion.tool_calls)] == \
        [(c.name, c.arguments) for c in completion.tool_calls]


def batched_equal_alone(engine: Engine, requests: list[tuple[list[dict], dict]]) -> list:
    """Each (tools, sampling) request alone, then all 8 batched: the same tokens and calls, and
    every call valid; the batched completions."""
    alone = [engine.chat(ASK, **s) for _, s in requests]
    backend = EngineBackend(engine, slots=8)
    assert backend.wait_batching()
    for i, (_, s) in enumerate(requests):
        backend.add(str(i), ASK, SamplingParams(**s))
    done = {}
    while backend.active:
        done |= {e.request_id: e.completion for e in backend.step() if isinstance(e, Finished)}
    batched = [done[str(i)] for i in range(len(requests))]
    for (tools, s), one, together in zip(requests, alone, batched, strict=True):
        assert_valid(together, tools, SamplingParams(**s))
        assert together.token_ids == one.token_ids
        assert [(c.name, c.arguments) for c in together.tool_calls] == \
            [(c.name, c.arguments) for c in one.tool_calls]
    return batched


def test_eight_batched_calls_equal_alone_and_are_valid(tiny):
    tools = [WEATHER, ADD]
    requests = [(tools, {"tools": tools, "tool_choice": CHOICES[i % 3], "parallel_tool_calls": i % 2 == 0,
                         "max_tokens": 64, **({"temperature": 0.8, "seed": i} if i >= 4 else {})})
                for i in range(8)]
    batched = batched_equal_alone(tiny, requests)
    assert sum(bool(c.tool_calls) for c in batched) >= 4  # required and named ones at least


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(toolsets=st.lists(TOOLSETS, min_size=8, max_size=8))
def test_eight_batched_generated_schemas_are_valid(tiny, toolsets):
    requests = []
    for i, pairs in enumerate(toolsets):
        tools = as_tools(pairs)
        choice = "required" if i % 2 else {"type": "function", "function": {"name": pairs[0][0]}}
        requests.append((tools, {"tools": tools, "tool_choice": choice, "max_tokens": 96,
                                 **({"temperature": 0.9, "seed": i} if i >= 4 else {})}))
    batched_equal_alone(tiny, requests)


def test_none_renders_no_tools_and_leaves_the_text_free(tiny):
    free = tiny.chat(ASK, max_tokens=24)
    none = tiny.chat(ASK, max_tokens=24, tools=[WEATHER], tool_choice="none")
    assert none.token_ids == free.token_ids and none.tool_calls == [] and none.finish_reason != "tool_calls"


def test_history_with_calls_and_results_renders_in_each_family(tiny):
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
    prompt = tiny.intake.render_chat(history, SamplingParams(tools=[WEATHER]))
    assert "Sunny, 21 C" in prompt and '"city": "Paris"' in prompt and "get_weather" in prompt
    if tiny.intake.tool_family == "hermes":
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
        assert "<tools>" in prompt
    elif tiny.intake.tool_family == "llama3":
        assert '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>' in prompt
        assert "ipython<|end_header_id|>\n\nSunny, 21 C" in prompt
    else:
        assert '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}' in prompt
        assert '{"tool_response": {"tool": "get_weather", "content": "Sunny, 21 C"}}' in prompt
    completion = tiny.chat(history, tools=[WEATHER, ADD], tool_choice="required", max_tokens=64)
    assert_valid(completion, [WEATHER, ADD], SamplingParams(tools=[WEATHER, ADD], tool_choice="required"))


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with Engine(smollm2_path, settings=F32) as engine:
        yield engine


@pytest.mark.slow
def test_smollm2_calls_the_tool_it_is_asked_for(smollm2):
    tools = [WEATHER, ADD]
    for choice in ("required", "auto"):
        completion = smollm2.chat(ASK, tools=tools, tool_choice=choice, parallel_tool_calls=False,
                                  max_tokens=48)
        assert completion.finish_reason == "tool_calls", completion
        assert [(c.name, json.loads(c.arguments)) for c in completion.tool_calls] == \
            [("get_weather", {"city": "Paris"})]
    named = smollm2.chat(ASK, tools=tools, tool_choice=CHOICES[2], parallel_tool_calls=False, max_tokens=48)
    assert [c.name for c in named.tool_calls] == ["add"]
    jsonschema.validate(json.loads(named.tool_calls[0].arguments), ADD["function"]["parameters"])


@pytest.mark.slow
def test_smollm2_calls_alone_and_eight_batched_agree(smollm2):
    tools = [WEATHER, ADD]
    requests = [(tools, {"tools": tools, "tool_choice": CHOICES[i % 3], "parallel_tool_calls": i % 2 == 1,
                         "max_tokens": 40, **({"temperature": 0.7, "seed": i} if i >= 4 else {})})
                for i in range(8)]
    batched = batched_equal_alone(smollm2, requests)
    assert all(c.tool_calls for c in batched[1::3])  # the required ones
