"""make_submit, where a client's request becomes a SUBMIT: what the wire cannot carry, or what is
over ovpool.bounds, is an InvalidRequestError naming the field before the request is tracked or
sent (issue 24: msgpack raising there killed the client's I/O loop)."""

from __future__ import annotations

import pytest

from ovpool import errors
from ovpool.bounds import MAX_PROMPT_CHARS
from ovpool.protocol import MAX_MESSAGE_BYTES, decode, encode
from ovpool.sampling_params import SamplingParams
from ovpool.submit import make_submit

LONE = "\ud800"  # what json.loads makes of "\\ud800": UTF-8 (so msgpack) cannot encode it


def param_of(prompt, model: str = "m", **sampling) -> str | None:
    with pytest.raises(errors.InvalidRequestError) as info:
        make_submit(prompt, model, None, sampling)
    return info.value.param


@pytest.mark.parametrize("sampling, param", [
    ({"max_tokens": 2**64}, "max_tokens"),
    ({"top_k": 2**64}, "top_k"),
    ({"seed": 2**64}, "seed"),
    ({"temperature": 3}, "temperature"),
    ({"stop": [LONE]}, "stop"),
    ({"logit_bias": {"\u00b2": 1}}, "logit_bias"),
    ({"logit_bias": {"1" * 5000: 1}}, "logit_bias"),
    ({"response_format": {"type": "json_schema", "schema": {"maximum": 2**65}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "schema": {"enum": [b"bytes"]}}}, "response_format"),
    ({"max_tokens": 200_000, "logprobs": 20}, "logprobs"),
])
def test_sampling_the_wire_cannot_carry_names_the_field(sampling, param):
    assert param_of("hi", **sampling) == param


def test_text_the_wire_cannot_carry_names_the_field():
    assert param_of(LONE) == "prompt"
    assert param_of("hi", model=LONE) == "model"
    assert param_of([{"role": "user", "content": LONE}]) == "messages[0].content"
    assert param_of([{"role": LONE, "content": "x"}]) == "messages[0].role"
    assert param_of([{"role": "user", "content": "x", "extra": 2**64}]) == "messages[0]"
    assert param_of([{"role": "user", "content": "x", "extra": b"raw"}]) == "messages[0]"


def test_a_prompt_over_the_cap_is_refused_and_one_at_it_is_sent():
    assert param_of("x" * 20_000_000) == "prompt"
    assert param_of([{"role": "user", "content": "x" * MAX_PROMPT_CHARS}, {"role": "user", "content": "y"}]) \
        == "messages"
    at_cap = make_submit("x" * MAX_PROMPT_CHARS, "m", None, {})
    assert decode(encode(at_cap)).prompt == at_cap.prompt


def test_what_msgpack_refuses_names_its_field_instead_of_raising_msgpacks_error():
    with pytest.raises(errors.InvalidRequestError, match="window: cannot be sent") as info:
        make_submit("hi", "m", None, {}, window=2**64)  # no bound of its own: the encode finds it
    assert info.value.param == "window"
    with pytest.raises(errors.InvalidRequestError) as info:
        make_submit("hi", "m", float("nan"), {})
    assert info.value.param == "timeout"


def test_a_submit_over_the_message_limit_counts_every_field():
    # Fields a chat template may read (beyond role and content) count too: the whole SUBMIT is measured.
    message = {"role": "user", "content": "x", "context": "y" * 1_000_000}  # each within the bounds
    big = [message] * (MAX_MESSAGE_BYTES // 1_000_000 + 1)
    with pytest.raises(errors.InvalidRequestError, match="67,108,864 bytes"):
        make_submit(big, "m", None, {})


def test_params_built_before_make_the_submit_keywords_would():
    params = SamplingParams(max_tokens=3, temperature=0.5, seed=11, stop=["."])
    assert make_submit("hi", "m", None, {"keep_alive": "90s"}, params=params).params == \
        make_submit("hi", "m", None, {"keep_alive": "90s", **params.to_dict()}).params
    with pytest.raises(errors.InvalidRequestError, match=r"sampling parameters \['top_k'\] beside params"):
        make_submit("hi", "m", None, {"top_k": 2}, params=params)
    with pytest.raises(errors.InvalidRequestError, match="params must be a SamplingParams, not dict") as info:
        make_submit("hi", "m", None, {}, params=params.to_dict())
    assert info.value.param == "params"
