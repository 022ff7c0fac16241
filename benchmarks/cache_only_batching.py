"""A worker's start on a warm cache, with and without cache-only mode: when it is ready, when its
continuous batching is, and its memory then (docs/operations.md, Warming the cache).

    python benchmarks/cache_only_batching.py --model smollm2 --repeats 3

Each start runs in a fresh process (an Engine and its EngineBackend, as ``ovpool worker`` makes
them); the modes alternate within each repeat, so a loaded host disturbs them alike. Printed per
start: seconds to ready (the engine's graph imported), seconds until batching is on (or "off"),
how the batching graph came (ir-hit: compiled from the cache's IR), and RSS at each point.
``--code DIR`` runs another checkout's ovpool (e.g. ``git archive main | tar -x -C DIR``) for a
before/after comparison.
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
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache_dir:
        warm = start(args.model, cache_dir, False, args.code)  # populates every entry
        print("warm-up start (populates):", json.dumps(warm))
        runs: dict[str, list[dict]] = {"default": [], "cache-only": []}
        for _ in range(args.repeats):
            for mode in runs:
                runs[mode].append(start(args.model, cache_dir, mode == "cache-only", args.code))
                print(mode, json.dumps(runs[mode][-1]), flush=True)
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
