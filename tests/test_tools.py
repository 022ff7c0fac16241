"""Tool calling's pure parts: the request's tools and tool_choice normalised and refused with the
field named (ovpool.tools), the wire forms round-trip, and a reply read as it streams gives pieces
that join to its calls however its text is cut (ovpool.worker.text.tool_reader)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ovpool.completion import Completion, Delta, Usage
from ovpool.errors import InvalidRequestError, MalformedMessageError
from ovpool.protocol import decode, delta_of, encode, partial_of
from ovpool.sampling_params import SamplingParams
from ovpool.tools import ToolCall, ToolCallDelta
from ovpool.worker.text import tool_format
from ovpool.worker.text.tool_reader import ToolReader

F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "x": {"type": "integer"}}, "required": ["x"]}}}


def test_tools_are_normalised_to_one_form_that_round_trips():
    choice = {"type": "function", "function": {"name": "g"}}
    params = SamplingParams(tools=[F, {"name": "g", "description": "G"}], tool_choice=choice)
    empty = {"type": "object", "properties": {}}
    assert params.tools == [
        {"name": "f", "description": "", "parameters": F["function"]["parameters"], "strict": False},
        {"name": "g", "description": "G", "parameters": empty, "strict": False}]
    assert params.tool_choice == {"name": "g"} and params.parallel_tool_calls and params.calls_tools
    assert SamplingParams.from_dict(params.to_dict()) == params
    assert SamplingParams(tools=[F]).tool_choice == "auto"
    assert SamplingParams(tools=[]).tools is None
    assert not SamplingParams(tools=[F], tool_choice="none").calls_tools


@pytest.mark.parametrize(("sampling", "param", "words"), [
    ({"tools": [{"name": "a b"}]}, "tools", "tools[0].name: must be 1 to 64"),
    ({"tools": [{"name": "a" * 65}]}, "tools", "tools[0].name"),
    ({"tools": [{"name": "a"}, {"name": "a"}]}, "tools", "declared twice"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools", "only function tools"),
    ({"tools": [{"name": "a", "parameters": {"type": "nope"}}]}, "tools", "tools[0].parameters: is not"),
    ({"tools": [{"name": "a", "strict": "yes"}]}, "tools", "tools[0].strict"),
    ({"tools": [{"name": "a", "color": 1}]}, "tools", "not ['color']"),
    ({"tools": [{"name": "a"}] * 129}, "tools", "at most 128"),
    ({"tool_choice": "auto"}, "tool_choice", "only allowed when tools are given"),
    ({"tools": [{"name": "a"}], "tool_choice": "any"}, "tool_choice", "must be one of"),
    ({"tools": [{"name": "a"}], "tool_choice": {"name": "b"}}, "tool_choice", "not among the tools"),
    ({"tools": [{"name": "a"}], "parallel_tool_calls": 1}, "parallel_tool_calls", "true or false"),
    ({"tools": [{"name": "a"}], "response_format": {"type": "json_object"}}, "response_format",
     "cannot be combined with tools"),
])
def test_bad_tools_are_refused_naming_the_field(sampling, param, words):
    with pytest.raises(InvalidRequestError) as refused:
        SamplingParams(**sampling)
    assert refused.value.param == param and words in str(refused.value)


def test_tools_with_a_format_are_fine_when_no_call_can_be_made():
    params = SamplingParams(tools=[F], tool_choice="none", response_format={"type": "json_object"})
    assert not params.calls_tools and params.response_format == {"type": "json_object"}


def test_calls_and_their_pieces_cross_the_wire():
    calls = [ToolCall("call_1", "f", '{"x": 1}')]
    c = Completion("", [1, 2], "tool_calls", Usage(3, 2), tool_calls=calls, stop=None)
    assert Completion.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    delta = Delta(4, 9, "", (), (ToolCallDelta(0, "call_1", "f", ""), ToolCallDelta(0, "", "", '{"x"')))
    assert delta_of(decode(encode(partial_of("r", delta, 0)))) == delta
    with pytest.raises(MalformedMessageError, match="tool_calls"):
        Completion.from_dict({**c.to_dict(), "tool_calls": [{"id": 1}]})
    with pytest.raises(MalformedMessageError, match=r"\[index, id, name, arguments\]"):
        ToolCallDelta.list_from_wire([[0, "a", "b"]])


def test_history_with_null_content_and_tool_results_passes_the_checks():
    from ovpool import bounds
    from ovpool.worker.text.chat import check_messages

    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    assert bounds.messages(history) == check_messages(history) == history
    with pytest.raises(InvalidRequestError, match="tool_calls"):
        bounds.messages([{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": 1}}]}])
    with pytest.raises(InvalidRequestError, match="content"):
        bounds.messages([{"role": "user", "content": None}])


@pytest.mark.parametrize("content", [None, "Let me look."])
@pytest.mark.parametrize("arguments, words", [
    ('{"city": "\\ud800"}', "lone surrogate"),     # the template would write it back unencodable
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_history_call_arguments_the_template_cannot_write_are_refused(content, arguments, words):
    from ovpool import bounds

    def history(args: str) -> list:
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}
        return [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": content, "tool_calls": [call]}]

    with pytest.raises(InvalidRequestError, match=words) as info:
        bounds.messages(history(arguments))
    assert info.value.param == "messages[1].tool_calls[0].function.arguments"
    for fine in ('{"n": 123456789012345678901234567890}', "not JSON", '{"city": "\\u00e9"}'):
        assert bounds.messages(history(fine)) == history(fine)  # big numbers, text, escapes: as given


def test_closing_objects_only_narrows_a_schema():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}}}},
              "$defs": {"d": {"properties": {"c": {}}}},
              "anyOf": [{"properties": {"e": {}}}], "items": {"allOf": [{"properties": {"f": {}}}]}}
    out = tool_format.closed(schema)
    assert out["additionalProperties"] is False and out["properties"]["a"]["additionalProperties"] is False
    assert out["$defs"]["d"]["additionalProperties"] is False
    assert out["anyOf"][0]["additionalProperties"] is False
    assert out["items"] == schema["items"]  # beside an allOf nothing is closed
    open_ = {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}}
    assert tool_format.closed(open_) == open_


ARGS = st.recursive(st.one_of(st.integers(), st.booleans(), st.none(), st.text(max_size=6)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                    max_leaves=6)
CALLS = st.lists(st.tuples(st.sampled_from(["f", "get-it", "x_2"]), st.dictionaries(st.text(max_size=4), ARGS,
                                                                                     max_size=3)),
                 min_size=0, max_size=3)


def hermes(text: str, calls) -> str:
    body = "\n".join(f'<tool_call>\n{{"name": "{n}", "arguments": {json.dumps(a)}}}\n</tool_call>'
                     for n, a in calls)
    return text + body


def llama3(text: str, calls) -> str:
    return text + "".join(f'{{"name": "{n}", "parameters": {json.dumps(a)}}}' for n, a in calls[:1])


def generic(text: str, calls) -> str:
    if not calls:
        return json.dumps({"response": text})
    return json.dumps({"tool_calls": [{"name": n, "arguments": a} for n, a in calls]})


@given(text=st.text(max_size=12).filter(lambda t: "<tool_call>" not in t and '{"name": "' not in t),
       calls=CALLS, kind=st.sampled_from(["hermes", "llama3", "generic"]),
       cuts=st.lists(st.integers(1, 8), max_size=40))
def test_pieces_join_to_the_calls_however_the_reply_is_cut(text, calls, kind, cuts):
    write = {"hermes": hermes, "llama3": llama3, "generic": generic}[kind]
    reply, calls = write(text, calls), calls[:1] if kind == "llama3" else calls
    reader, pos, seen, pieces = ToolReader(kind), 0, "", []
    for n in [*cuts, len(reply)]:
        chunk, pos = reply[pos:pos + n], pos + n
        out, new = reader.feed(chunk, final=pos >= len(reply))
        seen, pieces = seen + out, pieces + list(new)
        if pos >= len(reply):
            break
    assert [(c.name, json.loads(c.arguments)) for c in reader.calls] == [(n, a) for n, a in calls]
    assert seen == (text if kind != "generic" or not calls else "")
    for i, call in enumerate(reader.calls):
        [first] = [p for p in pieces if p.index == i and p.id]
        assert (first.id, first.name, first.arguments) == (call.id, call.name, "")
        assert "".join(p.arguments for p in pieces if p.index == i) == call.arguments
    assert reader.finish_reason("stop") == ("tool_calls" if calls else "stop")


def test_the_schema_check_remembers_a_bounded_number_of_digests_not_texts():
    from ovpool import tools

    problems = tools._Problems(2)
    texts = [json.dumps({"type": "object", "description": "x" * 100_000 + str(i)}) for i in range(3)]
    assert [problems.problem(t) for t in texts] == ["", "", ""]
    assert problems.problem('{"type": "no such type"}') != ""  # a problem is remembered as well
    assert len(problems._known) == 2 and all(len(key) == 32 for key in problems._known)
