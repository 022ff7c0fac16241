"""Structured output on SmolLM2: every sample of every constraint parses and validates (greedy and
seeded, alone and 8 batched); the mask never changes a greedy choice the constraint allows."""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

from ovpool import Engine
from ovpool.cli import main as cli_main
from ovpool.errors import InvalidRequestError
from ovpool.sampling_params import SamplingParams
from ovpool.worker.backend import EngineBackend, Finished

# f32: a batched pass gives each row the logits it has alone, so batched outputs equal alone ones.
F32 = {"inference_precision": "f32", "kv_cache_precision": "f32", "prefill_chunk": 16, "attention": "paged"}
USER = {"type": "object", "additionalProperties": False, "required": ["name", "id"], "properties": {
    "name": {"type": "string", "maxLength": 12}, "id": {"type": "integer", "minimum": 0, "maximum": 9999}}}
SCHEMAS = {
    "nested": {"type": "object", "additionalProperties": False, "required": ["user"],
               "properties": {"user": USER}},
    "array": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
              "minItems": 2, "maxItems": 4},
    "enum": {"type": "object", "additionalProperties": False, "required": ["color"],
             "properties": {"color": {"enum": ["red", "green", "blue"]}}},
    "bounds": {"type": "object", "additionalProperties": False, "required": ["t", "n"], "properties": {
        "t": {"type": "number", "minimum": -5, "maximum": 5},
        "n": {"type": "integer", "exclusiveMinimum": 10, "maximum": 99}}},
    "pattern": {"type": "object", "additionalProperties": False, "required": ["code"],
                "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}},
    "optional": {"type": "object", "additionalProperties": False, "required": ["ok"], "properties": {
        "ok": {"type": "boolean"}, "note": {"type": "string", "maxLength": 8}}},
}
REGEX = r"[0-9]{3}-[0-9]{4}"
LARK = 'start: answer " because " reason\nanswer: "yes" | "no"\nreason: /[a-z ]{1,20}/'
LARK_AS_REGEX = "(yes|no) because [a-z ]{1,20}"  # the language of LARK, to check outputs
ASK = "Answer with JSON only. Describe a user, a list of digits, a color, a temperature or a code."
# Any JSON object is unbounded: SmolLM2 closes this one (asked as ASK it repeats keys to max_tokens).
ASK_OBJECT = 'Reply with the JSON {"ok": true} and nothing else.'


def json_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}  # OpenAI's shape


def requests() -> list[tuple[str, list, dict, dict]]:
    """(name, messages, response_format, sampling) for every constraint, greedy and seeded."""
    formats = {name: json_format(s) for name, s in SCHEMAS.items()}
    formats |= {"json_object": {"type": "json_object"}, "regex": {"type": "regex", "pattern": REGEX},
                "grammar": {"type": "grammar", "lark": LARK}}
    out = []
    for name, fmt in formats.items():
        messages = [{"role": "user", "content": ASK_OBJECT if name == "json_object" else ASK}]
        out.append((f"{name}/greedy", messages, fmt, {}))
        out.append((f"{name}/seeded", messages, fmt, {"temperature": 0.8, "seed": 7}))
    return out


def assert_meets(name: str, text: str) -> None:
    kind = name.split("/")[0]
    if kind == "regex":
        assert re.fullmatch(REGEX, text), text
    elif kind == "grammar":
        assert re.fullmatch(LARK_AS_REGEX, text), text
    elif kind == "json_object":
        assert isinstance(json.loads(text), dict), text
    else:
        jsonschema.validate(json.loads(text), SCHEMAS[kind])


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with Engine(smollm2_path, settings=F32) as eng:
        yield eng


@pytest.mark.slow
def test_every_sample_alone_and_eight_batched_meets_its_constraint(smollm2):
    reqs = requests()
    # Alone: every greedy one and three seeded ones (decode at f32 costs ~0.1 s a token on 2 busy cores).
    alone = {name: smollm2.chat(messages, max_tokens=48, response_format=fmt, **sampling)
             for name, messages, fmt, sampling in reqs
             if name.endswith("greedy") or name.split("/")[0] in ("nested", "bounds", "grammar")}
    backend = EngineBackend(smollm2, slots=8)
    assert backend.wait_batching()
    batched = {}
    for start in range(0, len(reqs), 8):
        for name, messages, fmt, sampling in reqs[start:start + 8]:
            backend.add(name, messages, SamplingParams(max_tokens=48, response_format=fmt, **sampling))
        while backend.active:
            batched |= {e.request_id: e.completion for e in backend.step() if isinstance(e, Finished)}
    for name, *_ in reqs:
        assert batched[name].finish_reason == "stop", (name, batched[name].text)
        assert_meets(name, batched[name].text)
        if name in alone:
            assert alone[name].token_ids == batched[name].token_ids, name


@pytest.mark.slow
def test_constrained_greedy_equals_free_greedy_where_that_already_fits(smollm2):
    free = smollm2.complete("Count: 1, 2, 3,", max_tokens=12)
    fmt = {"type": "regex", "pattern": r"( [0-9]+,?)*"}  # the free text fits, token by token
    assert re.fullmatch(fmt["pattern"], free.text), free.text
    constrained = smollm2.complete("Count: 1, 2, 3,", max_tokens=12, response_format=fmt)
    assert constrained.token_ids == free.token_ids and constrained.finish_reason == free.finish_reason
    messages = [{"role": "user", "content": "Give me a JSON object with a person's name and age."}]
    free = smollm2.chat(messages, max_tokens=40)
    assert free.text.startswith("```json\n")  # SmolLM2 fences its JSON; the constraint cannot
    body = free.text.removeprefix("```json\n").split("\n```")[0]
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    prompt = smollm2.render_chat(messages) + "```json\n"
    free = smollm2.complete(prompt, max_tokens=len(smollm2.tokenize(body, add_special=False)))
    assert free.text == body and json.loads(body)
    constrained = smollm2.complete(prompt, max_tokens=40, response_format=json_format(schema))
    assert constrained.text == body and constrained.finish_reason == "stop"


@pytest.mark.slow
def test_max_tokens_mid_structure_ends_with_length(smollm2):
    out = smollm2.chat([{"role": "user", "content": ASK}], max_tokens=3,
                       response_format=json_format(SCHEMAS["nested"]))
    assert out.finish_reason == "length" and len(out.token_ids) == 3 and out.text.startswith("{")


@pytest.mark.slow
def test_a_complete_constraint_stops_even_when_eos_is_ignored(smollm2):
    out = smollm2.complete("Is the sky blue?", max_tokens=20, ignore_eos=True, logprobs=5,
                           response_format={"type": "grammar", "lark": 'start: " yes" | " no"'})
    assert out.text in (" yes", " no") and out.finish_reason == "stop"
    # Log-probabilities are of the masked logits (as vLLM's): a forbidden token is no alternative.
    first = out.logprobs[0]
    assert first.top and all(" yes".startswith(a.text) or " no".startswith(a.text) for a in first.top)
    assert all(math.isfinite(a.logprob) for t in out.logprobs for a in (t.chosen, *t.top))


def test_a_bad_constraint_is_refused_before_any_model_runs():
    for fmt, why in [({"type": "json_schema", "schema": {"type": "integer", "minimum": 5, "maximum": 1}},
                      "minimum"),
                     ({"type": "json_schema", "schema": {"type": "string", "pattern": "a("}}, "unclosed"),
                     ({"type": "regex", "pattern": "[0-9"}, "regex"),
                     ({"type": "grammar", "lark": "start: missing_rule"}, "missing_rule")]:
        with pytest.raises(InvalidRequestError, match=why):
            SamplingParams(response_format=fmt)


def test_cli_keeps_to_a_json_schema_file_and_names_a_bad_one(tiny_model, tmp_path):
    schema, bad = tmp_path / "answer.json", tmp_path / "bad.json"
    schema.write_text(json.dumps({"enum": ["yes", "no"]}))
    bad.write_text(json.dumps({"type": "integer", "minimum": 5, "maximum": 1}))
    model = str(tiny_model(arch="llama", weight_type="Q8_0"))
    result = CliRunner().invoke(cli_main, ["generate", "--model", model, "--max-tokens", "8",
                                           "--json-schema", str(schema), "Is it?"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) in ("yes", "no") and "finish: stop" in result.stderr
    for command in (["generate", "--model", model], ["complete", "--broker", "tcp://127.0.0.1:9"]):
        run = subprocess.run([sys.executable, "-m", "ovpool", *command, "--json-schema", str(bad), "x"],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "Traceback" not in run.stderr
        assert "error: response_format: the JSON schema is not usable: Unsatisfiable schema: minimum (5)" \
            in run.stderr


@pytest.mark.slow
def test_client_and_async_client_constrain_through_a_worker(tiny_model):
    from ovpool import AsyncClient, Client
    from ovpool.testing.pool import PoolProcess, broker, fast_heartbeats, free_endpoint, wait_for_workers

    code = {"type": "regex", "pattern": "[a-z]{3}-[0-9]{2}"}
    endpoint = free_endpoint()
    with fast_heartbeats(0.5), broker(endpoint), Client(endpoint) as client, \
            PoolProcess("worker", "--broker", endpoint, "--model", str(tiny_model()), "--slots", "4"):
        wait_for_workers(client, 1, timeout=120)
        futures = [client.submit("once upon a time", max_tokens=12, seed=i, temperature=1.0,
                                 response_format=code) for i in range(4)]
        outputs = [f.result(timeout=120) for f in futures]

        async def main():
            async with AsyncClient(endpoint) as aclient:
                return await aclient.complete("once upon a time", max_tokens=12, response_format=code)

        outputs.append(asyncio.run(main()))
    for out in outputs:
        assert re.fullmatch(code["pattern"], out.text) and out.finish_reason == "stop", out.text


def test_masks_forbid_exactly_what_the_constraint_forbids_and_leave_free_rows_alone(tiny_model):
    from ovpool.worker.generate.constraint import Vocabulary, masks_for
    from ovpool.worker.gguf.model import GGUFModel
    from ovpool.worker.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_metadata(GGUFModel.open(tiny_model()).metadata)
    vocabulary = Vocabulary(tokenizer)
    digits = {"type": "regex", "pattern": "[0-9]+"}
    fresh, grown, no_eos = (vocabulary.constraint(digits, ignore_eos=i == 2) for i in range(3))
    pieces = [tokenizer.piece(i) for i in range(tokenizer.vocab_size)]
    digit_ids = {i for i, p in enumerate(pieces) if p and p.isdigit()}
    assert digit_ids
    grown.advance(min(digit_ids))  # now complete: EOS allowed
    logits = np.random.default_rng(0).standard_normal((5, tokenizer.vocab_size)).astype(np.float32)
    masks = masks_for([fresh, None, grown, None, no_eos])
    masks.compute()
    out = masks.apply(logits)
    eos = set(tokenizer.eos_ids)
    for row, allowed in ((0, digit_ids), (2, digit_ids | eos), (4, digit_ids)):
        assert set(np.flatnonzero(out[row] > -np.inf)) == allowed
        np.testing.assert_array_equal(out[row][sorted(allowed)], logits[row][sorted(allowed)])
    np.testing.assert_array_equal(out[[1, 3]], logits[[1, 3]])
