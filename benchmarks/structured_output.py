"""Structured output: what the llguidance vocabulary costs to build, and decode tokens/s with a JSON
schema constraint vs unconstrained, 1 and 8 concurrent requests through the Batcher, in one run.

    .venv/bin/python benchmarks/structured_output.py [--model smollm2] [--tokens 64] [--rounds 5]

Each round runs every (concurrency, constrained?) case once, alternating, so that load from other
processes on the CPU hits both sides alike; the ratio is the median of the rounds' ratios. Both sides
generate exactly --tokens tokens: the schema (a long array of records) is not complete by then,
and the unconstrained side ignores EOS.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.worker.backend import EngineBackend, Finished
from ovpool.worker.generate.constraint import MaskBatch, Vocabulary

SCHEMA = {"type": "array", "minItems": 50, "items": {
    "type": "object", "additionalProperties": False, "required": ["name", "age", "tags"], "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["admin", "user", "guest"]}}}}}
PROMPT = [{"role": "user", "content": "List fifty people as JSON records with name, age and tags."}]


def decode_rates(backend: EngineBackend, concurrency: int,
                 params: SamplingParams) -> tuple[float, float, list]:
    """(decode tokens/s of all requests together, decode tokens per CPU second of this process,
    the completions):
    tokens after each one's first, over the wall (CPU) time from the first first-token to the end,
    prefill excluded. CPU time counts OpenVINO's and llguidance's threads too; on a CPU shared with
    other jobs it varies less than wall time."""
    for i in range(concurrency):
        backend.add(str(i), PROMPT, params)
    done, start = {}, None
    while backend.active:
        events = backend.step()
        start = start or (time.perf_counter(), time.process_time())
        done |= {e.request_id: e.completion for e in events if isinstance(e, Finished)}
    wall, cpu = time.perf_counter() - start[0], time.process_time() - start[1]
    assert all(len(c.token_ids) == params.max_tokens for c in done.values()), "a request ended early"
    tokens = sum(len(c.token_ids) - 1 for c in done.values())
    return tokens / wall, tokens / cpu, list(done.values())


def mask_cost(engine: Engine, fmt: dict, outputs: list) -> tuple[float, float]:
    """Median ms per step to compute, and to apply, the masks of ``outputs``' sequences replayed
    together (one batch of constrained rows), outside any forward pass."""
    constraints = [engine.constraint(SamplingParams(response_format=fmt)) for _ in outputs]
    logits = np.random.default_rng(0).standard_normal((len(outputs), engine.tokenizer.vocab_size), np.float32)
    computes, applies = [], []
    for step in range(min(len(c.token_ids) for c in outputs)):
        batch = MaskBatch(constraints)
        start = time.perf_counter()
        batch.compute()
        computes.append(time.perf_counter() - start)
        batch.apply(logits)
        applies.append(time.perf_counter() - start - computes[-1])
        for constraint, out in zip(constraints, outputs, strict=True):
            constraint.advance(out.token_ids[step])
    return statistics.median(computes) * 1e3, statistics.median(applies) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
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
        decode_rates(backend, 1, constrained)  # builds the vocabulary, warms both paths
        results: dict[tuple[int, bool], list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            for concurrency in (1, 8):
                for is_constrained, params in ((False, free), (True, constrained)):
                    *rates, outputs = decode_rates(backend, concurrency, params)
                    results.setdefault((concurrency, is_constrained), []).append(rates)
        compute_ms, apply_ms = mask_cost(engine, constrained.response_format, outputs)
    print(f"masks of 8 constrained rows per step (replayed, no forward pass): compute {compute_ms:.2f} ms, "
          f"apply {apply_ms:.2f} ms")
    for concurrency in (1, 8):
        for i, what in ((0, "tokens/s"), (1, "tokens per CPU s")):
            print(ratio_line(f"{concurrency} concurrent, {what}", [r[i] for r in results[concurrency, False]],
                             "JSON schema", [r[i] for r in results[concurrency, True]]))


def ratio_line(what: str, free_runs: list[float], label: str, held_runs: list[float]) -> str:
    """One paired result: both sides' medians and the median of the per-round ratios held:free."""
    ratios = [c / f for c, f in zip(held_runs, free_runs, strict=True)]
    return (f"{what}: unconstrained {statistics.median(free_runs):.1f}, {label} "
            f"{statistics.median(held_runs):.1f}, ratio {statistics.median(ratios):.3f} "
            f"(rounds: {', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
