"""The HTTP API on the real engine: `ovpool serve --http` with SmolLM2 driven by the openai SDK,
checked against an Engine in this process with the same settings (f32 compute and KV cache,
where a batched generation equals the same request alone: docs/architecture.md, Exactness)."""

from __future__ import annotations

import asyncio
import json

import anthropic
import numpy as np
import openai
import pytest
from serve_helpers import serve, wait_for

from ovpool.worker.engine import Engine

pytestmark = pytest.mark.slow
# warm_up=load: the kernel set-up runs before the worker registers; idle, it held the worker's loop
# past a heartbeat expiry on this loaded 2-core host (4.2 s), and the broker dropped it for a while.
EXACT = ("--set", "inference_precision=f32", "--set", "kv_cache_precision=f32", "--set", "warm_up=load")
SLOW_ENV = {"OVPOOL_HEARTBEAT_INTERVAL_S": "1.0"}  # a compiling worker may miss a 0.2 s heartbeat
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory, smollm2_path):
    tmp = tmp_path_factory.mktemp("api-engine")
    with serve(tmp, "--model", str(smollm2_path), "--served-name", "smol", "--workers", "1", "--slots", "4",
               "--cache-dir", str(tmp / "cache"), *EXACT, env=SLOW_ENV, http=True) as s:
        s.wait_states("ready", timeout=300)
        s.sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{s.http_port}/v1", api_key="none", max_retries=0)
        # Every test on the batched paged graph, the worker's steady state.
        wait_for(lambda: "continuous batching:" in s.output(), 300, "the paged graph")
        yield s


@pytest.fixture(scope="module")
def engine(smollm2_path):
    with Engine(smollm2_path, settings={"inference_precision": "f32", "kv_cache_precision": "f32"}) as e:
        yield e


def test_chat_greedy_equals_the_engine_and_counts_its_tokens(served, engine):
    assert [(m.id, m.workers) for m in served.sdk.models.list().data] == [("smol", 1)]
    out = served.sdk.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=24, temperature=0)
    alone = engine.chat(MESSAGES, max_tokens=24)
    assert out.choices[0].message.content == alone.text
    assert out.choices[0].finish_reason == alone.finish_reason
    assert out.usage.prompt_tokens == len(engine.prompt_ids(MESSAGES)) == alone.usage.prompt_tokens
    assert out.usage.completion_tokens == len(alone.token_ids)


def test_streamed_async_chat_equals_not_streamed(served):
    async def main():
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{served.http_port}/v1", api_key="none",
                                    max_retries=0)
        stream = await client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=24,
                                                      temperature=0, stream=True,
                                                      stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        await client.close()
        return chunks

    chunks = asyncio.run(main())
    whole = served.sdk.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=24, temperature=0)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        whole.choices[0].message.content
    assert chunks[-1].usage == whole.usage


def test_stop_strings_end_the_text_before_them(served, engine):
    prompt = "1, 2, 3, 4, 5,"
    out = served.sdk.completions.create(model="smol", prompt=prompt, max_tokens=32, temperature=0,
                                        stop=[" 8"])
    alone = engine.complete(prompt, max_tokens=32, stop=[" 8"])
    assert out.choices[0].text == alone.text and " 8" not in alone.text and alone.text
    assert out.choices[0].finish_reason == "stop"


def test_seeded_sampling_reproduces_and_n_uses_one_seed_per_choice(served):
    ask = dict(model="smol", prompt="Once upon a time", max_tokens=16, temperature=0.9, seed=123)
    first = served.sdk.completions.create(n=2, **ask)
    again = served.sdk.completions.create(n=2, **ask)
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    second_alone = served.sdk.completions.create(**{**ask, "seed": 124})
    assert first.choices[1].text == second_alone.choices[0].text


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    shifted = rows - rows.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def test_logprobs_are_the_engines_log_softmax(served, engine):
    """Chosen and top-3 log-probabilities equal log-softmax of Engine.logits at f32 (the worker's
    paged batch against the engine's paged graph alone differ by ~1e-7 in the logits)."""
    out = served.sdk.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=8, temperature=0,
                                             logprobs=True, top_logprobs=3)
    alone = engine.chat(MESSAGES, max_tokens=8)
    prompt = engine.prompt_ids(MESSAGES)
    rows = engine.logits(prompt + alone.token_ids)[len(prompt) - 1:-1]
    want = _log_softmax(rows.astype(np.float64))
    content = out.choices[0].logprobs.content
    assert len(content) == len(alone.token_ids)
    np.testing.assert_allclose([c.logprob for c in content],
                               want[np.arange(len(rows)), alone.token_ids], rtol=0, atol=1e-4)
    np.testing.assert_allclose([[t.logprob for t in c.top_logprobs] for c in content],
                               -np.sort(-want, axis=1)[:, :3], rtol=0, atol=1e-4)
    assert "".join(c.token for c in content) == out.choices[0].message.content
    assert all(c.bytes == list(c.token.encode()) for c in content)


def test_streamed_completion_logprobs_equal_the_whole_ones(served):
    ask = dict(model="smol", prompt="The colour of the sky is", max_tokens=10, temperature=0, logprobs=2)
    whole = served.sdk.completions.create(**ask).choices[0].logprobs
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in served.sdk.completions.create(stream=True, **ask):
        if chunk.choices[0].logprobs is not None:
            for key in streamed:
                streamed[key] += getattr(chunk.choices[0].logprobs, key)
    assert streamed == {key: getattr(whole, key) for key in streamed}
    assert whole.text_offset == list(np.cumsum([0] + [len(t) for t in whole.tokens[:-1]]))
    assert all(len(top) in (2, 3) and whole.tokens[i] in top for i, top in enumerate(whole.top_logprobs))


def test_json_schema_response_format_holds(served):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"], "additionalProperties": False}
    out = served.sdk.chat.completions.create(
        model="smol", messages=MESSAGES, max_tokens=48, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    assert out.choices[0].finish_reason == "stop"
    assert set(json.loads(out.choices[0].message.content)) == {"city"}


def test_chat_without_a_template_is_a_clear_400(tmp_path, tiny_model):
    # The tiny model without its template: the key renamed in place (same length, still valid GGUF).
    untemplated = tmp_path / "untemplated.gguf"
    key = b"tokenizer.chat_template"
    untemplated.write_bytes(tiny_model().read_bytes().replace(key, key[:-1] + b"X"))
    with serve(tmp_path, "--model", str(untemplated), "--workers", "1", env=SLOW_ENV, http=True) as s:
        s.wait_states("ready", timeout=120)
        sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{s.http_port}/v1", api_key="none", max_retries=0)
        name = sdk.models.list().data[0].id
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            sdk.chat.completions.create(model=name, messages=MESSAGES, max_tokens=2)
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            sdk.responses.create(model=name, input="hi", max_output_tokens=2)
        claude = anthropic.Anthropic(base_url=f"http://127.0.0.1:{s.http_port}", api_key="none",
                                     max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match="no chat template") as info:
            claude.messages.create(model=name, messages=MESSAGES, max_tokens=2)
        assert info.value.body["error"]["type"] == "invalid_request_error"


def test_anthropic_messages_streamed_and_not_and_count_tokens_are_the_engines(served, engine):
    claude = anthropic.Anthropic(base_url=f"http://127.0.0.1:{served.http_port}", api_key="none",
                                 max_retries=0)
    alone = engine.chat(MESSAGES, max_tokens=24)
    greedy = {"temperature": 0}  # the SDK has no temperature argument; older ones send it, as here
    out = claude.messages.create(model="smol", max_tokens=24, messages=MESSAGES, extra_body=greedy)
    assert out.content[0].text == alone.text
    assert out.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[alone.finish_reason]
    assert (out.usage.input_tokens, out.usage.output_tokens) == (len(engine.prompt_ids(MESSAGES)),
                                                                 len(alone.token_ids))
    with claude.messages.stream(model="smol", max_tokens=24, messages=MESSAGES, extra_body=greedy) as stream:
        assert "".join(stream.text_stream) == alone.text
        assert stream.get_final_message().usage == out.usage
    counted = claude.messages.count_tokens(model="smol", messages=MESSAGES)
    assert counted.input_tokens == out.usage.input_tokens


def test_responses_text_format_json_schema_holds(served):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"], "additionalProperties": False}
    out = served.sdk.responses.create(model="smol", input=MESSAGES, max_output_tokens=48, temperature=0,
                                      text={"format": {"type": "json_schema", "name": "answer",
                                                       "schema": schema, "strict": True}})
    assert out.status == "completed" and out.incomplete_details is None
    assert set(json.loads(out.output_text)) == {"city"}
