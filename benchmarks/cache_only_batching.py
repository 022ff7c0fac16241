"""A worker's start on a warm cache, with and without cache-only mode: when it is ready, when its
continuous batching is, and its memory then (docs/operations.md, Warming the cache).

    python benchmarks/cache_only_batching.py --model smollm2 --repeats 3

Each start runs in a fresh process (an Engine and its EngineBackend, as ``ovpool worker`` makes
them); the modes alternate within each repeat, so a loaded host disturbs them alike. Printed per
start: seconds to ready (the engine's graph imported), seconds until batching is on (or "off"),
how the batching graph came (ir-hit: compiled from the cache's IR), and RSS at each point.
``--code DIR`` runs another checkout's ovpool (e.g. ``git archive main | tar -x -C DIR``) for a
before/after comparison. ``--streams N`` then measures what batching buys a cache-only worker: N
concurrent greedy requests of 32 tokens, one pass per request per token (as without batching)
against one pass for all, alternating, tokens/s of each round.
"""

from __future__ import annotations

import argparse
import json
import site
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from ovpool.worker.backend import EngineBackend
from ovpool.worker.engine import Engine

def rss():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(fields["VmRSS"].split()[0]) >> 10

model, cache_dir, cache_only = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
with Engine(model, cache_dir=cache_dir, cache_only=cache_only) as engine:
    backend = EngineBackend(engine, slots=8)
    ready, ready_rss = time.perf_counter() - t0, rss()
    batching = backend.wait_batching()
    done = time.perf_counter() - t0
    print(json.dumps({"ready_s": ready, "ready_rss_mib": ready_rss, "batching": batching,
                      "batching_s": done if batching else None, "batching_rss_mib": rss(),
                      "paged": (engine.load_report.get("paged") or {}).get("outcome"),
                      "plan": engine.load_report.get("batching")}))
"""


STREAMS = r"""
import sys, time
from ovpool.sampling_params import SamplingParams
from ovpool.worker.backend import EngineBackend, Finished, Interleaved
from ovpool.worker.engine import Engine

model, cache_dir, n, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
prompts = [f"Tell me a story about the number {i}." for i in range(n)]
params = SamplingParams(max_tokens=32, ignore_eos=True)
with Engine(model, cache_dir=cache_dir, cache_only=True) as engine:
    backend = EngineBackend(engine, slots=n)
    assert backend.wait_batching(), engine.load_report["batching"]
    backend.idle()
    ways = {"one pass per request": Interleaved(engine), "batched": backend.runs}
    for _ in range(rounds):
        for name, runs in ways.items():
            for i, p in enumerate(prompts):
                runs.add(str(i), p, params)
            start, finished = time.perf_counter(), 0
            while finished < n:
                finished += sum(isinstance(e, Finished) for e in runs.step())
            print(f"{name}: {n * 32 / (time.perf_counter() - start):.1f} tok/s", flush=True)
"""


def streams(model: str, cache_dir: str, n: int, rounds: int) -> None:
    subprocess.run([sys.executable, "-c", STREAMS, model, cache_dir, str(n), str(rounds)], check=True,
                   timeout=1200)


def start(model: str, cache_dir: str, cache_only: bool, code: str | None) -> dict:
    program = [sys.executable, "-c", CHILD]
    if code:  # without site's .pth files: this venv's editable install would win over PYTHONPATH
        paths = [code, *site.getsitepackages()]
        program = [sys.executable, "-S", "-c", f"import sys; sys.path[:0] = {paths!r}\n{CHILD}"]
    out = subprocess.run([*program, model, cache_dir, "1" if cache_only else "0"],
                         capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--code", default=None, help="PYTHONPATH of another ovpool checkout to run")
    ap.add_argument("--streams", type=int, default=0, help="then N concurrent requests, see above")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache_dir:
        warm = start(args.model, cache_dir, False, args.code)  # populates every entry
        print("warm-up start (populates):", json.dumps(warm))
        runs: dict[str, list[dict]] = {"default": [], "cache-only": []}
        for _ in range(args.repeats):
            for mode in runs:
                runs[mode].append(start(args.model, cache_dir, mode == "cache-only", args.code))
                print(mode, json.dumps(runs[mode][-1]), flush=True)
        if args.streams:
            streams(args.model, cache_dir, args.streams, args.repeats)
    for mode, rows in runs.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("ready_s", "ready_rss_mib",
                                                                    "batching_rss_mib")}
        times = [r["batching_s"] for r in rows if r["batching_s"] is not None]
        batching = f"at {statistics.median(times):.2f} s" if times else "off"
        print(f"{mode}: ready {med['ready_s']:.2f} s ({med['ready_rss_mib']:.0f} MiB), batching "
              f"{batching} "
              f"({med['batching_rss_mib']:.0f} MiB), paged graph: {rows[0]['paged']}")


if __name__ == "__main__":
    main()
