"""The HTTP API's pure parts: request bodies checked field by field, error mapping, API keys,
the bind address and serve's command lines for it."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from ovpool import bounds, errors
from ovpool.api import errors as api_errors
from ovpool.api.app import Config, create_app
from ovpool.api.keys import ApiKeys, parse
from ovpool.api.schema import MAX_BODY_BYTES, parse_chat, parse_completion, parse_json
from ovpool.api.server import parse_bind
from ovpool.protocol import sampling_to_wire
from ovpool.sampling_params import SamplingParams
from ovpool.serve.spec import PoolSpec
from ovpool.settings import Settings
from ovpool.submit import make_submit

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def bad_param(call, body) -> str | None:
    with pytest.raises(errors.InvalidRequestError) as info:
        call(body)
    return info.value.param


def test_openai_defaults_and_unknown_fields_ignored():
    gen = parse_completion({"model": "m", "prompt": "p", "user": "u", "some_new_field": {"x": 1}})
    (choice,) = gen.choices
    assert choice.sampling == {"max_tokens": 16, "temperature": 1.0, "seed": None}  # OpenAI's defaults
    assert (gen.chat, gen.stream, gen.echo, gen.logprobs, gen.n) == (False, False, False, None, 1)
    chat = parse_chat(CHAT, max_tokens=4096)
    assert chat.choices[0].sampling["max_tokens"] == 4096 and chat.choices[0].prompt == CHAT["messages"]


def test_fields_map_onto_sampling_params():
    gen = parse_chat({**CHAT, "max_tokens": 9, "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5,
                      "top_k": -1, "seed": 5, "stop": "\n", "n": 3, "ignore_eos": True}, max_tokens=100)
    assert [c.index for c in gen.choices] == [0, 1, 2]
    assert [c.sampling["seed"] for c in gen.choices] == [5, 6, 7]  # n choices, n seeds
    assert SamplingParams(**gen.choices[0].sampling) == SamplingParams(
        max_tokens=7, temperature=0.0, top_p=0.5, top_k=0, seed=5, stop=("\n",), ignore_eos=True)
    negative = parse_completion({"model": "m", "prompt": "p", "seed": -1})
    assert negative.choices[0].sampling["seed"] == 2**63 - 1


def test_a_request_builds_its_sampling_params_once_and_its_submits_send_them(monkeypatch):
    built = []
    check = SamplingParams.__post_init__
    monkeypatch.setattr(SamplingParams, "__post_init__", lambda self: (built.append(1), check(self)))
    gen = parse_completion({"model": "m", "prompt": ["a", "b"], "n": 2, "seed": 5, "stop": "\n"})
    submits = [make_submit(c.prompt, gen.model, gen.timeout, {"keep_alive": gen.keep_alive}, params=c.params)
               for c in gen.choices]
    assert len(built) <= 1  # one build at most (none for a set seen before): not per choice nor SUBMIT
    wanted = [sampling_to_wire(SamplingParams(**c.sampling)) for c in gen.choices]
    assert [s.params for s in submits] == wanted


def test_requests_that_share_sampling_params_get_their_own_values():
    """Equal scalars share one SamplingParams, but only when equal as values to pass on: -0.0 is
    not 0.0, 1 is not 1.0 nor True (which ignore_eos refuses, however often True was seen)."""
    zero, negative = (parse_completion({"model": "m", "prompt": "p", "temperature": t}).choices[0].params
                      for t in (0.0, -0.0))
    assert str(zero.temperature) == "0.0" and str(negative.temperature) == "-0.0"
    whole, fraction = (parse_completion({"model": "m", "prompt": "p", "top_k": 1, "top_p": p}).choices[0]
                       for p in (1, 1.0))
    assert whole.params is not fraction.params and whole.params == SamplingParams(**whole.sampling)
    assert parse_completion({"model": "m", "prompt": "p", "ignore_eos": True}).choices[0].params.ignore_eos
    with pytest.raises(errors.InvalidRequestError, match="ignore_eos"):
        parse_completion({"model": "m", "prompt": "p", "ignore_eos": 1})


def test_sampler_fields_and_logprobs_map_onto_sampling_params():
    gen = parse_chat({**CHAT, "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
                      "repetition_penalty": 1.2, "logit_bias": {"5": 2, "7": -100}, "logprobs": True,
                      "top_logprobs": 3}, max_tokens=8)
    assert SamplingParams(**gen.choices[0].sampling) == SamplingParams(
        max_tokens=8, temperature=1.0, min_p=0.1, presence_penalty=0.5, frequency_penalty=-0.5,
        repetition_penalty=1.2, logit_bias=((5, 2.0), (7, -100.0)), logprobs=3)
    assert gen.logprobs == 3
    assert parse_chat({**CHAT, "logprobs": True}, 8).logprobs == 0
    assert parse_completion({"model": "m", "prompt": "p", "logprobs": 2}).choices[0].sampling["logprobs"] == 2
    assert bad_param(parse_completion, {"model": "m", "prompt": "p", "repetition_penalty": 0}) == \
        "repetition_penalty"


def test_prompt_lists_and_n_number_the_choices_like_openai():
    gen = parse_completion({"model": "m", "prompt": ["a", "b"], "n": 2})
    assert [(c.index, c.prompt) for c in gen.choices] == [(0, "a"), (1, "a"), (2, "b"), (3, "b")]


def test_chat_content_parts_are_joined_and_others_refused():
    gen = parse_chat({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None}]}, max_tokens=8)
    assert gen.choices[0].prompt == [{"role": "user", "content": "ab"}, {"role": "assistant", "content": ""}]
    image = {"model": "m",
             "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
    assert bad_param(lambda b: parse_chat(b, 8), image) == "messages[0].content"


@pytest.mark.parametrize("field, value", [
    ("temperature", -1), ("temperature", "hot"), ("top_p", 0), ("top_p", 1.5), ("top_k", -2), ("n", 0),
    ("n", 129), ("max_tokens", 0), ("max_tokens", 2.5), ("seed", 2**64), ("stop", [""]), ("stop", 3),
    ("stream", "yes"), ("model", None), ("timeout", 0), ("presence_penalty", 3), ("logit_bias", {"x": 1}),
    ("logit_bias", {"5": 101}), ("stream_options", {"include_usage": True}),
])
def test_bad_values_are_400_naming_the_field(field, value):
    body = {"model": "m", "prompt": "p", field: value}
    assert bad_param(parse_completion, body) in (field, "stream_options")


def test_refused_features_say_what_instead():
    text = parse_chat({**CHAT, "response_format": {"type": "text"}}, 8)
    assert "response_format" not in text.choices[0].sampling
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = parse_chat({**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": schema}}}, 8).choices[0].sampling["response_format"]
    assert fmt == {"type": "json_schema", "schema": schema}  # OpenAI's shape, passed on canonical
    for bad in ({"type": "xml"}, {"type": "regex", "pattern": "("}, "json"):
        assert bad_param(lambda b: parse_chat(b, 8), {**CHAT, "response_format": bad}) == "response_format"
    assert bad_param(lambda b: parse_chat(b, 8), {**CHAT, "tools": [{"type": "function"}]}) == "tools"
    assert bad_param(parse_completion, {"model": "m", "prompt": [1, 2, 3]}) == "prompt"
    assert bad_param(lambda b: parse_chat(b, 8), {**CHAT, "top_logprobs": 2}) == "top_logprobs"
    assert bad_param(parse_completion, {"model": "m", "prompt": "p", "echo": True, "logprobs": 1}) == "echo"
    with pytest.raises(errors.InvalidRequestError, match="JSON object"):
        parse_completion(["not", "an", "object"])


def test_stream_options_need_stream():
    gen = parse_completion({"model": "m", "prompt": "p", "stream": True,
                            "stream_options": {"include_usage": True}})
    assert gen.stream and gen.include_usage


@pytest.mark.parametrize("exc, status, code", [
    (errors.InvalidRequestError("x"), 400, "request.invalid"),
    (errors.UnauthorizedError("x"), 401, "invalid_api_key"),
    (errors.ModelNotFoundError("x"), 404, "model_not_found"),
    (errors.QueueFullError("x"), 429, "request.queue_full"),
    (errors.WorkerLostError("x"), 503, "request.worker_lost"),
    (errors.BrokerUnavailableError("x"), 503, "request.broker_unavailable"),
    (errors.RequestTimeoutError("x"), 504, "request.timeout"),
    (errors.ModelLoadError("x"), 500, "model.load"),
    (errors.from_wire("request.something_new", "x"), 500, "request"),  # a newer peer's code: its parent
])
def test_error_tree_maps_to_statuses_once(exc, status, code):
    assert api_errors.classify(exc)[0] == status
    assert api_errors.body(exc)["error"]["code"] == code
    assert ("Retry-After" in api_errors.headers(exc)) == (status == 429)


def test_api_keys_several_bearer_and_open_without_any():
    keys = ApiKeys(parse(["k1,k2", " k3 "]))
    for good in ("Bearer k1", "bearer k2", "Bearer k3"):
        keys.check(good)
    for bad in (None, "", "Bearer", "Basic k1", "Bearer k4", "Bearer k1k2"):
        with pytest.raises(errors.UnauthorizedError):
            keys.check(bad)
    ApiKeys().check(None)  # no key configured: open
    assert not ApiKeys(parse([""]))


def test_each_app_takes_its_generation_routes_from_its_own_config():
    """Two apps in one process (each with its own keys): each POST is judged by its own app's."""
    def app(*keys: str) -> TestClient:  # no lifespan: refused before any broker is needed
        return TestClient(create_app(Config("tcp://127.0.0.1:1", Settings.resolve({}), ApiKeys(keys), 16)))

    open_app, keyed_app = app(), app("k1")
    assert keyed_app.post("/v1/completions", json={}).status_code == 401
    refused = open_app.post("/v1/completions", json={})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt"


def test_open_api_warns_off_loopback_only(caplog):
    with caplog.at_level(logging.WARNING, logger="ovpool.api.keys"):
        for host in ("127.0.0.1", "::1", "localhost"):
            ApiKeys().warn_if_open(host)
        ApiKeys(["k"]).warn_if_open("0.0.0.0")
        assert not caplog.records
        ApiKeys().warn_if_open("0.0.0.0")
    assert "without an API key" in caplog.records[0].getMessage()


def test_serve_spec_runs_the_api_child_with_the_pool_endpoint():
    spec = PoolSpec(bind="tcp://0.0.0.0:5555", http="0.0.0.0:8000", served_names=("a", "b"))
    assert spec.api_argv()[-4:] == ["--broker", "tcp://127.0.0.1:5555", "--bind", "0.0.0.0:8000"]
    argv = spec.worker_argv("CPU", "CPU")
    assert argv[argv.index("--served-name") + 1] == "a" and argv.count("--served-name") == 2
    assert parse_bind("[::1]:8000") == ("::1", 8000) and parse_bind("0.0.0.0:80") == ("0.0.0.0", 80)
    for bad in ("8000", "host:", ":80", "h:99999"):
        with pytest.raises(errors.ConfigError, match="HOST:PORT"):
            parse_bind(bad)


def test_a_completion_note_is_shown_beside_its_finish_reason():
    from ovpool.api.responses import Reply, full, last_chunk
    from ovpool.completion import Completion, Usage

    note = "stopped at the model's context of 256 tokens (250 prompt + 6 generated), before ..."
    noted, plain = (Completion("abc", [1, 2, 3], "length", Usage(250, 6), note=note),
                    Completion("abc", [1, 2, 3], "length", Usage(3, 3)))
    for gen in (parse_completion({"model": "m", "prompt": "p"}),
                parse_chat({"model": "m", "messages": [{"role": "user", "content": "p"}]}, 64)):
        (choice,) = full(Reply(gen), [noted])["choices"]
        assert choice["finish_reason"] == "length" and choice["note"] == note
        assert "note" not in full(Reply(gen), [plain])["choices"][0]
        (last,) = last_chunk(Reply(gen), 0, noted)["choices"]
        assert last["finish_reason"] == "length" and last["note"] == note


def test_the_documented_limits_are_the_enforced_ones():
    doc = (Path(__file__).parents[1] / "docs" / "operations.md").read_text()
    limits = doc[doc.index("**Limits.**"):doc.index("Errors are OpenAI's JSON")]
    for value in (MAX_BODY_BYTES, bounds.MAX_JSON_DEPTH, bounds.MAX_PROMPT_CHARS, bounds.MAX_CHOICES,
                  bounds.MAX_MESSAGES, bounds.MAX_NAME_CHARS, bounds.MAX_TOKENS, bounds.MAX_REQUEST_TOKENS,
                  bounds.MAX_LOGPROB_ENTRIES, bounds.MAX_LOGPROBS, bounds.MAX_STOP, bounds.MAX_STOP_CHARS,
                  bounds.MAX_LOGIT_BIAS_ENTRIES, bounds.MAX_FORMAT_SIZE, len(str(bounds.MAX_TOKEN_ID))):
        assert re.search(rf"(?<![\d,]){value:,}(?![\d,])", limits), value
    assert f"{MAX_BODY_BYTES >> 20} MiB" in limits and f"0-{bounds.MAX_TEMPERATURE:g}" in limits


@pytest.mark.parametrize("raw, param, words", [
    (b"[" * 100_000 + b"]" * 100_000, None, "nests more than 64"),  # the C decoder's RecursionError
    (b'{"a": ' + b"[" * 64 + b"]" * 64 + b"}", "a", "more than 64 levels"),  # parsed, walked iteratively
    (b'{"max_tokens": ' + b"9" * 5000 + b"}", None, "not valid JSON"),  # Python's 4,300-digit limit
    (b'{"prompt": "\xff"}', None, "not valid JSON"),
    (b'{"prompt": ', None, "not valid JSON"),
])
def test_a_body_json_cannot_hold_is_a_400(raw, param, words):
    with pytest.raises(errors.InvalidRequestError, match=words) as info:
        parse_json(raw)
    assert info.value.param == param


def test_a_body_at_the_nesting_cap_parses():
    nested: list = []
    for _ in range(62):
        nested = [nested]
    assert parse_json(b'{"a": ' + b"[" * 63 + b"]" * 63 + b"}") == {"a": nested}  # 64 levels with the body
