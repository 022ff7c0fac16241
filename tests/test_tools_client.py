"""Tool calls through the pool as a user makes them: ``Client``/``AsyncClient`` with ``tools=``
(whole and streamed) and ``ovpool complete --tools FILE``, against a real worker on a tiny model
of the hermes family; the request's tools are checked once, in the client, before it is sent."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
from cli_run import clean_error, ovpool

from ovpool.async_client import AsyncClient
from ovpool.client import Client
from ovpool.errors import InvalidRequestError
from ovpool.testing.pool import PoolProcess, broker, free_endpoint, wait_for_workers
from ovpool.testing.tiny_vocab import QWEN_TOOLS_TEMPLATE

ASK = [{"role": "user", "content": "Add 2 and 3."}]
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                                    "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                   "required": ["a", "b"]}}}
ECHO = {"type": "function", "function": {
    "name": "echo", "parameters": {"type": "object", "properties": {"word": {"enum": ["hi", "bye"]}},
                                   "required": ["word"]}}}
TOOLS = [ADD, ECHO]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def pool(tiny_model):
    """A broker and one engine worker on a tiny qwen2 model with a tools template."""
    path = tiny_model(arch="qwen2", weight_type="F16", context_length=2048, chat_template=QWEN_TOOLS_TEMPLATE)
    endpoint = free_endpoint()
    # Default heartbeats: a worker compiling its graphs may miss fast ones and be dropped.
    with broker(endpoint), \
            PoolProcess("worker", "--broker", endpoint, "--model", str(path), "--slots", "4",
                        "--served-name", "tiny"), \
            Client(endpoint, timeout=60) as client:
        wait_for_workers(client, 1, timeout=60)
        yield endpoint, client


def assert_valid(calls) -> None:
    assert calls
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def test_a_client_gets_valid_calls_whole_and_streamed(pool):
    _, client = pool
    whole = client.chat(ASK, tools=TOOLS, tool_choice="required", max_tokens=96)
    assert whole.finish_reason == "tool_calls" and whole.text == ""
    assert_valid(whole.tool_calls)
    stream = client.stream(ASK, tools=TOOLS, tool_choice="required", max_tokens=96)
    pieces = [p for delta in stream for p in delta.tool_calls]
    firsts = [p for p in pieces if p.id]
    assert [(p.index, p.name) for p in firsts] == [(i, c.name) for i, c in enumerate(whole.tool_calls)]
    assert [p.id for p in firsts] == [c.id for c in stream.completion.tool_calls]
    for i, call in enumerate(whole.tool_calls):  # greedy: the same calls, in pieces
        assert "".join(p.arguments for p in pieces if p.index == i) == call.arguments


def test_an_async_client_gets_the_named_call(pool):
    endpoint, _ = pool

    async def main():
        async with AsyncClient(endpoint, timeout=60) as client:
            echo = {"type": "function", "function": {"name": "echo"}}
            return await client.chat(ASK, tools=TOOLS, tool_choice=echo, parallel_tool_calls=False,
                                     max_tokens=96)

    completion = asyncio.run(main())
    assert [c.name for c in completion.tool_calls] == ["echo"]
    assert_valid(completion.tool_calls)


def test_bad_tools_fail_in_the_client_naming_the_field(pool):
    _, client = pool
    with pytest.raises(InvalidRequestError, match=r"tools\[0\]\.name") as bad_name:
        client.chat(ASK, tools=[{"type": "function", "function": {"name": "no spaces"}}])
    with pytest.raises(InvalidRequestError, match="not among the tools") as unknown:
        client.chat(ASK, tools=TOOLS, tool_choice={"name": "mul"})
    with pytest.raises(InvalidRequestError, match="chat messages") as plain:
        client.complete("Add 2 and 3.", tools=TOOLS)
    assert (bad_name.value.param, unknown.value.param, plain.value.param) == ("tools", "tool_choice", "tools")


def test_complete_with_tools_prints_the_calls_as_json(pool, tmp_path):
    endpoint, _ = pool
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    done = ovpool("complete", "Add 2 and 3.", "--broker", endpoint, "--tools", str(tools),
                  "--tool-choice", "add", "--no-parallel-tool-calls", "--max-tokens", "96")
    assert done.returncode == 0, done.stderr
    [call] = json.loads(done.stdout)
    assert call["name"] == "add" and call["id"].startswith("call_")
    jsonschema.validate(call["arguments"], SCHEMAS["add"])
    as_json = ovpool("complete", "Add 2 and 3.", "--broker", endpoint, "--tools", str(tools),
                     "--tool-choice", "required", "--max-tokens", "96", "--json")
    completion = json.loads(as_json.stdout)
    assert completion["finish_reason"] == "tool_calls" and completion["tool_calls"]


def test_complete_refuses_tool_flags_it_cannot_use(pool, tmp_path):
    endpoint, _ = pool
    lone = ovpool("complete", "hi", "--broker", endpoint, "--tool-choice", "required")
    assert lone.returncode == 2 and "need --tools FILE" in clean_error(lone)
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    bad = ovpool("complete", "hi", "--broker", endpoint, "--tools", str(broken))
    assert bad.returncode == 2 and "is not JSON" in clean_error(bad) and "Traceback" not in bad.stderr
