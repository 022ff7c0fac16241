"""Two source trees' worker execution paths, alternated: single-stream TTFT and decode tokens/s
(``Engine.complete``) and 8 concurrent requests (``EngineBackend``, continuous batching).

    .venv/bin/python benchmarks/runtime_ab.py --tree new=/work/main --tree base=/work/base
        [--model smollm2] [--rounds 3] [--prompt-tokens 256] [--new-tokens 64]

Each round runs every tree once, in a fresh subprocess with that tree first on PYTHONPATH (and the
working directory elsewhere, so the editable install does not shadow it); which tree goes first
alternates. A subprocess loads the engine (through the compiled-model cache), warms it up, then
times single streams on fresh prompts (no prefix-cache hit) and one batch of 8. Reported: the
median over rounds of each side's best-of-round, and the median paired ratio new/base.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
import numpy as np
from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.worker.backend import EngineBackend, Finished, Failed

model, prompt_tokens, new_tokens, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(int(time.time() * 1e6) % 2**32)
def prompt():  # ordinary token ids, fresh each time: no prefix-cache hit
    return [int(t) for t in rng.integers(1000, 20000, prompt_tokens)]
out = {"tree": __import__("ovpool").__file__}
with Engine(model) as eng:
    eng.warm_up()
    eng.complete(prompt(), max_tokens=8, ignore_eos=True)
    single = [eng.complete(prompt(), max_tokens=new_tokens, ignore_eos=True).timings for _ in range(reps)]
    out["ttft_s"] = min(t["ttft_s"] for t in single)
    out["decode_tps"] = max(t["decode_tps"] for t in single)
    backend = EngineBackend(eng, slots=8)
    assert backend.wait_batching()
    backend.idle()
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    for i in range(8):
        backend.add(str(i), prompt(), params)
    done = {}
    while backend.active:
        for ev in backend.step():
            assert not isinstance(ev, Failed), ev
            if isinstance(ev, Finished):
                done[ev.request_id] = ev.completion
    wall = time.perf_counter() - start
    out["c8_tps"] = sum(len(c.token_ids) for c in done.values()) / wall
    out["c8_ttft_s"] = sorted(c.timings["ttft_s"] for c in done.values())[4]
print(json.dumps(out))
"""

METRICS = (("ttft_s", "single TTFT (s)"), ("decode_tps", "single decode (tok/s)"),
           ("c8_tps", "8 concurrent (tok/s, all)"), ("c8_ttft_s", "8 concurrent TTFT p50 (s)"))


def run(tree: str, args: argparse.Namespace, script: str) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    cmd = [sys.executable, script, args.model, str(args.prompt_tokens), str(args.new_tokens), str(args.reps)]
    proc = subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH; the first is 'new'")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    trees = [t.split("=", 1) for t in args.tree]
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(CHILD)
    results: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        for name, path in order:
            results[name].append(run(path, args, f.name))
            print(f"round {r} {name}: {results[name][-1]}", file=sys.stderr, flush=True)
    (a, _), (b, _) = trees[0], trees[1]
    print(f"{'metric':28} {a:>10} {b:>10} {'paired ' + a + '/' + b:>14}")
    for key, label in METRICS:
        med = {n: statistics.median(x[key] for x in results[n]) for n in (a, b)}
        ratio = statistics.median(x[key] / y[key] for x, y in zip(results[a], results[b], strict=True))
        print(f"{label:28} {med[a]:10.3f} {med[b]:10.3f} {ratio:14.3f}")


if __name__ == "__main__":
    main()
