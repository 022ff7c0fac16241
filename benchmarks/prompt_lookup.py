"""Prompt-lookup decoding against none, in one process: decode tokens/s on tasks that copy their
input and on open-ended ones, the tokens compared, and how many drafted tokens held.

    .venv/bin/python benchmarks/prompt_lookup.py --model smollm2 [--modes off,auto,on] \
        [--rounds 3] [--max-tokens 96] [--tokens 4]

Each mode is an Engine on the paged graph with ``prompt_lookup=<mode>`` (warmed up: the decode
graph serves its one-token steps, as in a worker). A round runs every prompt greedily on every
mode, the modes' order rotating from round to round, so a slow spell of a shared host hits the
sides of a pair alike; a figure is the median over rounds of decode tok/s (first token to last)
and of the process's CPU ms per decoded token, and the median of the per-round ratios to ``off``
(CPU time is far less noisy than wall time on a shared host). The output names the CPU class and
the host's load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.worker.backend import EngineBackend, Finished
from ovpool.worker.graph.cpu_class import CpuInfo

FRUIT = "apples, bananas, cherries, dates, elderberries, figs, grapes, honeydew, kiwis, lemons, mangoes"
TEXT = ("The quick brown fox jumps over the lazy dog. The dog sleeps in the sun all afternoon, and the "
        "fox runs back to the forest. In the evening the farmer calls the dog home, feeds it, and locks "
        "the gate before the fox can come back.")
CODE = ("def total_price(items, discount):\n    result = 0\n    for item in items:\n"
        "        result += item.price * item.quantity\n    if discount:\n"
        "        result = result * (1 - discount)\n    return round(result, 2)\n")
COPYING = {
    "repeat list": f"Repeat this list exactly, once: {FRUIT}.",
    "edit text": f"Rewrite this text exactly, but change 'dog' to 'cat': {TEXT}",
    "edit code": f"Add a docstring to this Python function and return the whole function:\n\n{CODE}",
    "summarise": f"Summarise this text in two sentences, quoting it where you can: {TEXT}",
}
FREE = {
    "poem": "Write a short poem about the sea.",
    "explain": "Explain why the sky is blue to a child.",
    "story": "Tell me a short story about a robot who learns to paint.",
}


def load(path: str) -> str:
    return open(path).read().split()[0] if Path(path).exists() else "?"


def as_prompt(engine: Engine, text: str):
    """A chat of one user message, or for a model without a chat template the text and a blank line."""
    return [{"role": "user", "content": text}] if engine.load_report["chat"] else f"{text}\n\n"


def run(engines: dict[str, Engine], prompt: str, max_tokens: int) -> dict[str, tuple]:
    """Per mode: (decode tok/s, token ids, drafted tokens, accepted ones, verify passes, CPU ms
    per decoded token). Decode is first token to last; CPU time is the process's (every thread),
    which time spent descheduled on a shared host does not inflate."""
    out = {}
    for mode, engine in engines.items():
        counts = dict(engine._streams().batcher.lookup)
        first = None
        with engine.generation(as_prompt(engine, prompt), SamplingParams(max_tokens=max_tokens)) as gen:
            for delta in gen:
                if first is None:
                    first = delta.index, time.process_time()
            c, cpu = gen.completion(), time.process_time()
        after = engine._streams().batcher.lookup
        decoded = len(c.token_ids) - 1 - first[0] if first else 0
        out[mode] = (c.timings.get("decode_tps", 0.0), c.token_ids,
                     *(after[k] - counts[k] for k in ("proposed", "accepted", "passes")),
                     1000 * (cpu - first[1]) / decoded if decoded > 0 else float("nan"))
    return out


def batched(backends: dict[str, EngineBackend], prompts: list[str], max_tokens: int) -> dict[str, float]:
    """Per mode: generated tokens/s of ``prompts`` run at once (one Batcher, greedy)."""
    out = {}
    for mode, backend in backends.items():
        start, tokens = time.perf_counter(), 0
        params = SamplingParams(max_tokens=max_tokens)
        for i, prompt in enumerate(prompts):
            backend.add(f"{mode}-{i}", as_prompt(backend.engine, prompt), params)
        while backend.active:
            tokens += sum(len(e.completion.token_ids) for e in backend.step() if isinstance(e, Finished))
        out[mode] = tokens / (time.perf_counter() - start)
    return out


def report_batched(engines: dict[str, Engine], modes: list[str], args) -> None:
    backends = {m: EngineBackend(engines[m], slots=args.concurrent) for m in modes}
    for b in backends.values():
        b.wait_batching()
    for kind, prompts in (("copy", list(COPYING.values())), ("free", list(FREE.values()))):
        batch = [prompts[i % len(prompts)] for i in range(args.concurrent)]
        rounds = []
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            rounds.append(batched({m: backends[m] for m in order}, batch, args.max_tokens))
        cells = [f"{m} {statistics.median(x[m] for x in rounds):.1f} tok/s"
                 + ("" if m == "off" else f" ({statistics.median(x[m] / x['off'] for x in rounds):.2f}x)")
                 for m in modes]
        print(f"{args.concurrent} concurrent {kind}: " + ", ".join(cells))


def timed_passes(engine: Engine) -> dict[int, list[float]]:
    """Records the seconds of each one-sequence pass of ``engine``'s single streams, by positions."""
    runner, seconds = engine._streams().batcher.runner, defaultdict(list)
    forward = runner.forward

    def timed(chunks, *args, **kwargs):
        start = time.perf_counter()
        out = forward(chunks, *args, **kwargs)
        if len(chunks) == 1 and chunks[0].start > 0:
            seconds[len(chunks[0].tokens)].append(time.perf_counter() - start)
        return out

    runner.forward = timed
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--modes", default="off,auto,on")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--tokens", type=int, default=4, help="prompt_lookup_tokens")
    p.add_argument("--concurrent", type=int, default=0, help="also N requests at once through a Batcher")
    p.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE", help="settings of every mode")
    args = p.parse_args()
    extra = dict(kv.split("=", 1) for kv in args.set)
    modes = args.modes.split(",")
    print(f"CPU class: {CpuInfo.read().class_name}; load at start: {load('/proc/loadavg')}; "
          f"model {args.model}")
    engines = {m: Engine(args.model, settings={"attention": "paged", "prompt_lookup": m.split(":")[0],
                                               "prompt_lookup_tokens": args.tokens, **extra}) for m in modes}
    for m, engine in engines.items():  # a mode "auto:2": auto, proposing from n-grams of 2 or more
        if ":" in m:
            engine._streams().batcher.drafts.min_n = int(m.split(":")[1])
    try:
        for e in engines.values():
            e.warm_up()
        passes = timed_passes(engines[modes[-1]])
        report(engines, modes, args)
        if args.concurrent:
            report_batched(engines, modes, args)
        one = statistics.median(passes[1])
        print(f"{modes[-1]}: one-position pass {1000 * one:.1f} ms; n positions, in those: " + ", ".join(
            f"{n}: {statistics.median(t) / one:.2f} ({len(t)})" for n, t in sorted(passes.items()) if n > 1))
    finally:
        for e in engines.values():
            e.close()
    print(f"load at end: {load('/proc/loadavg')}")


def report(engines: dict[str, Engine], modes: list[str], args) -> None:
    prompts = {**{f"copy: {k}": v for k, v in COPYING.items()}, **{f"free: {k}": v for k, v in FREE.items()}}
    results: dict[str, list[dict]] = {name: [] for name in prompts}
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for name, prompt in prompts.items():
            results[name].append(run({m: engines[m] for m in order}, prompt, args.max_tokens))
    header = " | ".join(f"{m} tok/s | {m} CPU ms/tok" + ("" if m == "off" else
                        f" | {m}/off wall | {m}/off CPU | {m} held/drafted (passes)") for m in modes)
    print(f"| prompt | tokens | {header} | same tokens |")
    print("|---" * (2 + 2 * len(modes) + 3 * (len(modes) - 1)) + "|---|")
    for name, rounds in results.items():
        print(f"| {name} | {len(rounds[0]['off'][1])} | {' | '.join(cells(rounds, modes))} | "
              f"{all(len({tuple(x[m][1]) for m in modes}) == 1 for x in rounds)} |")


def cells(rounds: list[dict], modes: list[str]) -> list[str]:
    """A prompt's row: per mode the medians over rounds; against ``off`` the median of the
    per-round ratios (speed-ups: off's CPU time per token over the mode's)."""
    out = []
    for m in modes:
        out += [f"{statistics.median(x[m][0] for x in rounds):.1f}",
                f"{statistics.median(x[m][5] for x in rounds):.1f}"]
        if m != "off":
            drafted, held, passes = (sum(x[m][i] for x in rounds) for i in (2, 3, 4))
            out += [f"{statistics.median(x[m][0] / x['off'][0] for x in rounds):.2f}x",
                    f"{statistics.median(x['off'][5] / x[m][5] for x in rounds):.2f}x",
                    f"{held}/{drafted} ({passes})" if drafted else "-"]
    return out

if __name__ == "__main__":
    main()
