"""Process start → first token: no cache, a cache hit, cache-only mode, and GenAI, in one run.

Every run is a fresh Python process; the parent stamps the wall clock just before starting it and
the child reports the wall clock at its first generated token, so the time includes interpreter
start, imports, model load and the first forward pass. The child also reports its load time alone
(``Engine(...)`` or ``openvino_genai.LLMPipeline(...)``). Medians over ``--repeats``.

    .venv/bin/python benchmarks/cache_startup.py [--model smollm2] [--device CPU] [--repeats 3]
        [--evict] [--json]

Targets (issue 4): a hit's start-to-first-token ≤ 0.25× the uncached start, and the engine's load
on a hit ≤ 0.15× GenAI's load. ``--evict`` drops the GGUF's and the blob's pages from the page
cache before each run (POSIX_FADV_DONTNEED), measuring a cold disk instead of a warm page cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "The capital of France is"
SCENARIOS = ("no cache", "hit", "cache-only", "genai")


def child(args: argparse.Namespace) -> None:
    if args.child == "genai":
        import openvino_genai as genai

        from ovpool.worker.model import resolve_model_path

        t0 = time.perf_counter()
        pipe = genai.LLMPipeline(str(resolve_model_path(args.model)), args.device)
        load_s, outcome = time.perf_counter() - t0, "genai"
        t1 = time.perf_counter()
        pipe.generate(PROMPT, max_new_tokens=1)
    else:
        from ovpool.worker.engine import Engine

        t0 = time.perf_counter()
        engine = Engine(args.model, device=args.device, cache_dir=args.cache_dir or None,
                        cache_only=args.child == "cache-only")
        load_s, outcome = time.perf_counter() - t0, engine.load_report["outcome"]
        t1 = time.perf_counter()
        engine.complete(PROMPT, max_tokens=1)
    print(json.dumps({"first_token_at": time.time(), "load_s": load_s, "outcome": outcome,
                      "first_forward_s": time.perf_counter() - t1}))


def evict(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run(scenario: str, args: argparse.Namespace, cache_dir: str) -> dict:
    cmd = [sys.executable, __file__, "--child", scenario, "--model", args.model, "--device", args.device,
           "--cache-dir", "" if scenario in ("no cache", "genai") else cache_dir]
    if args.evict:
        from ovpool.worker.model import resolve_model_path

        evict([resolve_model_path(args.model), *Path(cache_dir).glob("v1/blobs/*.blob")])
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{scenario} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"start_to_first_token_s": out["first_token_at"] - start, "load_s": out["load_s"],
            "first_forward_s": out["first_forward_s"], "outcome": out["outcome"]}


def summarize(runs: dict[str, list[dict]]) -> dict:
    med = {s: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "outcome"}
           for s, rs in runs.items()}
    hit_vs_cold = med["hit"]["start_to_first_token_s"] / med["no cache"]["start_to_first_token_s"]
    load_vs_genai = med["hit"]["load_s"] / med["genai"]["load_s"]
    return {"median": med, "hit_vs_no_cache": hit_vs_cold, "hit_load_vs_genai_load": load_vs_genai,
            "targets_met": {"hit <= 0.25x no cache": hit_vs_cold <= 0.25,
                            "hit load <= 0.15x genai load": load_vs_genai <= 0.15}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="GGUF path or alias (default smollm2)")
    p.add_argument("--device", default="CPU")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--evict", action="store_true", help="drop GGUF and blob pages before each run")
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", choices=(*SCENARIOS, "populate"), help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory(prefix="ovpool-cache-bench-") as cache_dir:
        populate = run("populate", args, cache_dir)
        assert populate["outcome"] == "wrote", populate
        runs: dict[str, list[dict]] = {s: [] for s in SCENARIOS}
        for _ in range(args.repeats):
            for scenario in SCENARIOS:  # interleaved, so background load hits every scenario alike
                runs[scenario].append(run(scenario, args, cache_dir))
    summary = {"populate (compile + export)": populate, **summarize(runs)}
    if args.json:
        print(json.dumps({"runs": runs, **summary}, indent=2))
    else:
        print_table(summary, args)


def print_table(summary: dict, args: argparse.Namespace) -> None:
    print(f"model={args.model} device={args.device} repeats={args.repeats} evict={args.evict} (medians)")
    print(f"{'scenario':<14}{'start→first token (s)':>24}{'load (s)':>12}{'first forward (s)':>20}")
    for s in SCENARIOS:
        m = summary["median"][s]
        print(f"{s:<14}{m['start_to_first_token_s']:>24.2f}{m['load_s']:>12.2f}{m['first_forward_s']:>20.2f}")
    populate = summary["populate (compile + export)"]
    print(f"populate (compile + export): {populate['start_to_first_token_s']:.2f} s")
    print(f"hit / no cache: {summary['hit_vs_no_cache']:.3f} (target <= 0.25); hit load / genai load: "
          f"{summary['hit_load_vs_genai_load']:.3f} (target <= 0.15)")


if __name__ == "__main__":
    main()
