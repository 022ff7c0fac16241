"""Two sets of graph settings for one model, in one process: what each costs in agreement and in
decode time.

    .venv/bin/python benchmarks/settings_ab.py --model gemma3-270m --a kquant_requant=none \
        --b kquant_requant=auto [--steps 200] [--positions 1800]

Agreement: teacher-forced top-1 of each side's logits against the exact graph's (f32 compute, f32
KV cache) over ``--positions`` tokens of this repository's docs, in windows of 300. Decode: one
generation per side after the same 512-token prompt, stepped in turn (which side goes first
alternates), the process's CPU time and the wall time of each step; medians per side and the median
of the per-step ratios a/b, so a slow spell of a shared machine hits both sides of a pair alike.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.settings import parse_assignments

EXACT = {"inference_precision": "f32", "kv_cache_precision": "f32"}
WINDOW = 300


def doc_ids(engine: Engine, n: int) -> list[int]:
    root = Path(__file__).parents[1]
    text = "\n".join(p.read_text() for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))])
    return engine.tokenize(text, add_special=False)[:n]


def agreement(engines: dict[str, Engine], model: str, ids: list[int]) -> dict[str, float]:
    windows = [ids[i:i + WINDOW] for i in range(0, len(ids), WINDOW)]
    with Engine(model, settings=EXACT, cache_dir="") as exact:
        best = [exact.logits(w).argmax(-1) for w in windows]
    return {side: sum(int((e.logits(w).argmax(-1) == b).sum()) for w, b in zip(windows, best, strict=True))
            / len(ids) for side, e in engines.items()}


def step_times(engines: dict[str, Engine], prompt: list[int], steps: int) -> dict[str, np.ndarray]:
    """Per side, [steps, 2]: each decode step's CPU and wall milliseconds."""
    params = SamplingParams(max_tokens=steps + 1, ignore_eos=True)
    gens = {side: e.generation(prompt, params) for side, e in engines.items()}
    for gen in gens.values():
        gen.step()  # the prompt pass
    times: dict[str, list[tuple[float, float]]] = {side: [] for side in gens}
    for i in range(steps):
        for side in list(gens)[::-1] if i % 2 else list(gens):
            cpu, wall = time.process_time(), time.perf_counter()
            gens[side].step()
            times[side].append((1000 * (time.process_time() - cpu), 1000 * (time.perf_counter() - wall)))
    for gen in gens.values():
        gen.close()
    return {side: np.array(t) for side, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--a", nargs="*", default=[], metavar="NAME=VALUE", help="side a's settings")
    p.add_argument("--b", nargs="*", default=[], metavar="NAME=VALUE", help="side b's settings")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--positions", type=int, default=1800)
    args = p.parse_args()
    sides = {"a": parse_assignments(args.a), "b": parse_assignments(args.b)}
    engines = {side: Engine(args.model, settings=s, cache_dir="") for side, s in sides.items()}
    try:
        for e in engines.values():
            e.warm_up()  # the decode graph, as a serving worker has it
        ids = doc_ids(engines["a"], max(args.positions, 512))
        agree = agreement(engines, args.model, ids[:args.positions])
        times = step_times(engines, ids[:512], args.steps)
    finally:
        for e in engines.values():
            e.close()
    for side, s in sides.items():
        cpu, wall = np.median(times[side], axis=0)
        print(f"{side} {s or '(defaults)'}: top-1 agreement with f32 {agree[side]:.4f} over "
              f"{args.positions} positions; per decode step median {cpu:.2f} CPU ms, {wall:.2f} ms")
    cpu, wall = np.median(times["a"] / times["b"], axis=0)
    print(f"a/b per step, median of {args.steps} step pairs: CPU {cpu:.3f}, wall {wall:.3f}")


if __name__ == "__main__":
    main()
