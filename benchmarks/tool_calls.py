"""Tool calls: decode tokens/s of grammar-held tool calls vs unconstrained text, 8 concurrent
requests through the Batcher in one run, and what a 10-tool request's grammar costs to set up.

    .venv/bin/python benchmarks/tool_calls.py [--model smollm2] [--tokens 64] [--rounds 5]

As benchmarks/structured_output.py: each round runs both sides once, alternating, and the ratio is
the median of the rounds' ratios; CPU time per token (this process's, OpenVINO's and llguidance's
threads) varies less than wall time on a shared CPU. Both sides generate exactly --tokens tokens:
the call's arguments (a long array of records) are not complete by then, and the unconstrained
side, the same prompt with its tools rendered as text, ignores EOS; decode is timed once every
prefill is done. Set-up: validating the request (SamplingParams, in the client and the broker) and
building its matcher with the first mask (the worker), median of --rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

from structured_output import SCHEMA, ratio_line

from ovpool import Engine, tools
from ovpool.sampling_params import SamplingParams
from ovpool.worker.backend import EngineBackend, Finished

SAVE = {"type": "function", "function": {"name": "save_people", "description": "Store people records",
                                         "parameters": {"type": "object", "required": ["people"],
                                                        "properties": {"people": SCHEMA}}}}
PROMPT = [{"role": "user", "content": "Save fifty people with name, age and tags."}]


def ten_tools() -> list[dict]:
    """Ten tools of a few typed arguments each (each schema its own), as an agent declares them."""
    text = {"type": "string"}

    def properties(i: int) -> dict:
        return {"query": {"type": "string", "maxLength": 16 * (i + 1)},
                "limit": {"type": "integer", "minimum": i}, "mode": {"enum": ["fast", "exact", "fuzzy"]},
                "tags": {"type": "array", "items": text},
                "when": {"type": "object", "properties": {"from": text, "to": text}}}

    return [{"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Tool number {i}",
        "parameters": {"type": "object", "required": ["query", "limit"], "properties": properties(i)}}}
        for i in range(10)]


def decode_rates(backend: EngineBackend, params: SamplingParams, prompt, n: int = 8) -> tuple[float, float]:
    """(decode tokens/s, decode tokens per CPU second) of ``n`` requests together, from the step
    after which every one has its first token: a request with tools is admitted on the Preparer's
    thread, so its prefill may fall into later steps than a free one's, and is not decode."""
    for i in range(n):
        backend.add(str(i), prompt, params)
    generations = backend.runs._generations  # the Batcher's: when every prefill is behind
    while len(generations) < n or not all(g.token_ids for g in generations.values()):
        backend.step()
    before = sum(len(g.token_ids) for g in generations.values())
    wall, cpu, done = time.perf_counter(), time.process_time(), {}
    while backend.active:
        done |= {e.request_id: e.completion for e in backend.step() if isinstance(e, Finished)}
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert all(len(c.token_ids) == params.max_tokens for c in done.values()), "a request ended early"
    tokens = sum(len(c.token_ids) for c in done.values()) - before
    return tokens / wall, tokens / cpu


def setup_ms(engine: Engine, rounds: int) -> tuple[float, float, float]:
    """Median ms to validate a 10-tool request the first time (its schemas compiled) and again (the
    same tools, as an agent's next turn sends them: cached), and to build its constraint (grammar,
    matcher and first mask) on ``engine``'s vocabulary."""
    first, again, build = [], [], []
    for _ in range(rounds):
        tools._PROBLEMS.clear()  # the first validation compiles every schema again
        for times in (first, again):
            start = time.perf_counter()
            params = SamplingParams(tools=ten_tools(), tool_choice="auto")
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        engine.intake.constraint(params)
        build.append(time.perf_counter() - start)
    return tuple(statistics.median(t) * 1e3 for t in (first, again, build))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with Engine(args.model, settings={"attention": "paged"}) as engine:
        backend = EngineBackend(engine, slots=8)
        assert backend.wait_batching()
        free = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
        calls = SamplingParams(max_tokens=args.tokens, tools=[SAVE], tool_choice="required")
        # The same prompt, tools and all, on both sides: only the grammar differs.
        rendered = engine.intake.render_chat(PROMPT, calls)
        decode_rates(backend, calls, PROMPT, 1)  # builds the vocabulary, warms both paths
        results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for held, params, prompt in ((False, free, rendered), (True, calls, PROMPT)):
                results[held].append(decode_rates(backend, params, prompt))
        first_ms, again_ms, build_ms = setup_ms(engine, args.rounds)
    print(f"10-tool request: validated in {first_ms:.1f} ms the first time, {again_ms:.2f} ms again (client, "
          f"broker), its constraint built with the first mask in {build_ms:.1f} ms (worker)")
    for i, what in ((0, "tokens/s"), (1, "tokens per CPU s")):
        print(ratio_line(f"8 concurrent, {what}", [r[i] for r in results[False]], "tool calls",
                         [r[i] for r in results[True]]))


if __name__ == "__main__":
    main()
