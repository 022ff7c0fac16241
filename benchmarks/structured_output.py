"""Structured output: what the llguidance vocabulary costs to build, and decode tokens/s with a JSON
schema constraint vs unconstrained, 1 and 8 concurrent requests through the Batcher, in one run.

    .venv/bin/python benchmarks/structured_output.py [--model smollm2] [--tokens 64] [--rounds 3]

Each round runs every (concurrency, constrained?) case once, alternating, so that load from other
processes on the CPU hits both sides alike; the ratio is the median of the rounds' ratios. Both sides
generate exactly --tokens tokens: the schema (a long array of records) is not complete by then,
and the unconstrained side ignores EOS.
"""

from __future__ import annotations

import argparse
import statistics
import time

from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.worker.backend import EngineBackend, Finished
from ovpool.worker.generate.constraint import Vocabulary

SCHEMA = {"type": "array", "minItems": 50, "items": {
    "type": "object", "additionalProperties": False, "required": ["name", "age", "tags"], "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["admin", "user", "guest"]}}}}}
PROMPT = [{"role": "user", "content": "List fifty people as JSON records with name, age and tags."}]


def decode_tps(backend: EngineBackend, concurrency: int, params: SamplingParams) -> float:
    """Decode tokens/s of all requests together: tokens after each one's first, over the wall time
    from the first first-token to the end (prefill excluded)."""
    for i in range(concurrency):
        backend.add(str(i), PROMPT, params)
    done, first_token_at = {}, None
    while backend.active:
        events = backend.step()
        first_token_at = first_token_at or time.perf_counter()
        done |= {e.request_id: e.completion for e in events if isinstance(e, Finished)}
    elapsed = time.perf_counter() - first_token_at
    assert all(len(c.token_ids) == params.max_tokens for c in done.values()), "a request ended early"
    return sum(len(c.token_ids) - 1 for c in done.values()) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with Engine(args.model, settings={"attention": "paged"}) as engine:
        start = time.perf_counter()
        Vocabulary(engine.tokenizer)
        print(f"llguidance vocabulary of {engine.tokenizer.vocab_size:,} tokens: "
              f"{time.perf_counter() - start:.2f} s")
        backend = EngineBackend(engine, slots=8)
        assert backend.wait_batching()
        free = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
        constrained = SamplingParams(max_tokens=args.tokens,
                                     response_format={"type": "json_schema", "schema": SCHEMA})
        decode_tps(backend, 1, constrained)  # builds the vocabulary, warms both paths
        results: dict[tuple[int, bool], list[float]] = {}
        for _ in range(args.rounds):
            for concurrency in (1, 8):
                for is_constrained, params in ((False, free), (True, constrained)):
                    tps = decode_tps(backend, concurrency, params)
                    results.setdefault((concurrency, is_constrained), []).append(tps)
    for concurrency in (1, 8):
        free_runs, constrained_runs = results[concurrency, False], results[concurrency, True]
        ratios = [c / f for c, f in zip(constrained_runs, free_runs, strict=True)]
        print(f"{concurrency} concurrent: unconstrained {statistics.median(free_runs):.1f} tokens/s, "
              f"JSON schema {statistics.median(constrained_runs):.1f} tokens/s, ratio "
              f"{statistics.median(ratios):.3f} (rounds: {', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
