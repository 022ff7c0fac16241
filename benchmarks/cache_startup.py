"""Process start → first token: no cache, a cache hit, cache-only mode, and GenAI, in one run.

Every run is a fresh Python process; the parent stamps the wall clock just before starting it and
the child reports the wall clock at its first generated token, so the time includes interpreter
start, imports, model load and the first forward pass; ovpool's children start as an ``ovpool``
command does (OpenVINO's model converter and most of the gguf package deferred, see
ovpool.startup; a likely cache hit's import begun before the engine's modules load, see
ovpool.cache.prefetch). The child also reports its CPU time (every thread, from its start) at that
token: on a host other jobs load, the wall time swings with them and the CPU time far less.
Medians over ``--repeats``.

    .venv/bin/python benchmarks/cache_startup.py [--model smollm2] [--device CPU] [--repeats 3]
        [--evict] [--no-genai] [--json]

Engine load alone (``openvino_genai.LLMPipeline(...)``; for ovpool from ``prefetch.start(...)``,
which begins a likely hit's import before the engine's modules load, to ``Engine(...)`` returning,
so it also counts importing those modules, which GenAI's figure does not) is compared both ways,
because the CPU plugin's one-time set-up can sit in different places: by default (``warm_up=idle``)
ovpool's Engine and GenAI's LLMPipeline both leave it to their first requests (an ovpool worker
runs it once registered and idle); the "hit, warm-up at load" scenario pays it in the constructor
(``warm_up=load``). The set-up is the plugin repacking every weight matrix into the blocked layout
of each shape class it meets (1-6 rows and 7+ rows get different layouts here). Each child also
times the set-up its first requests paid: the short prompt's first token, then a longer prompt (18
tokens) with a decode step, minus the same requests once warm.
Both engines get the raw prompt (GenAI's chat template off), greedy, EOS ignored.

"hit" begins the import before the engine's modules load, as ``ovpool generate`` and ``ovpool worker``
do (with the imported graph's first pass on the import's thread only on more than 2 cores,
ovpool.worker.graph.first_pass); "hit, early pass" always runs that pass there, to compare in the
same run (issue 30).

Targets (issues 4, 30): a hit's start-to-first-token ≤ 0.15× the uncached start, and the engine's load
on a hit ≤ 0.15× GenAI's load, judged like-for-like (neither set up, or both). ``--evict`` drops
the GGUF's and the blob's pages from the page cache before each run (POSIX_FADV_DONTNEED),
measuring a cold disk instead of a warm page cache.
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
from collections.abc import Callable
from pathlib import Path

PROMPT = "The capital of France is"
# 18 tokens: prefills of 7 rows or more use a weight layout of their own (see above).
LONG_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle on the beach"
SCENARIOS = ("no cache", "hit", "hit, early pass", "hit, warm-up at load", "cache-only", "genai")


def load(args: argparse.Namespace) -> tuple[dict, Callable[[str, int], object]]:
    """Load the scenario's model; (load figures, a function running one request: prompt, new tokens)."""
    if args.child == "genai":
        import openvino_genai as genai

        from ovpool.worker.gguf.model import resolve_model_path

        t0 = time.perf_counter()
        pipe = genai.LLMPipeline(str(resolve_model_path(args.model)), args.device)
        return ({"load_s": time.perf_counter() - t0, "warm_up_s": 0.0, "outcome": "genai"},
                lambda prompt, n: pipe.generate(prompt, max_new_tokens=n, ignore_eos=True,
                                                apply_chat_template=False))
    from ovpool.startup import defer_heavy_imports

    defer_heavy_imports()  # as every ovpool command (worker, generate) starts
    from ovpool.cache import prefetch
    from ovpool.config import GraphConfig
    from ovpool.worker.graph.first_pass import for_warm_up, one_token_pass

    # cache_dir "" (the "no cache" run): no cache at all, not the default one.
    settings = {"warm_up": "load" if args.child == "hit, warm-up at load" else "idle",
                "cache_dir": args.cache_dir}
    t0 = time.perf_counter()
    # As `ovpool generate` and `ovpool worker` do before importing the engine ("hit, early pass":
    # with the imported graph's first pass on the import's thread, on any number of cores).
    first_pass = one_token_pass if args.child == "hit, early pass" else for_warm_up(settings["warm_up"])
    early = prefetch.start(args.model, args.device, GraphConfig(), args.cache_dir, first_pass=first_pass)
    from ovpool.worker.engine import Engine

    engine = Engine(args.model, device=args.device, cache_only=args.child == "cache-only",
                    settings=settings, early=early)
    figures = {"load_s": time.perf_counter() - t0, "outcome": engine.load_report["outcome"],
               "warm_up_s": engine.load_report["seconds"].get("warm-up", 0.0),
               "early_first_pass": early is not None and early.set_up}
    return figures, lambda prompt, n: engine.complete(prompt, max_tokens=n, ignore_eos=True)


def timed(request: Callable[[str, int], object], prompt: str, new_tokens: int) -> float:
    t0 = time.perf_counter()
    request(prompt, new_tokens)
    return time.perf_counter() - t0


def child(args: argparse.Namespace) -> None:
    figures, request = load(args)
    first = timed(request, PROMPT, 1)
    first_token_at, first_token_cpu = time.time(), time.process_time()
    first_long = timed(request, LONG_PROMPT, 2)  # the other prefill layout, and a decode step
    setup = first - timed(request, PROMPT, 1) + first_long - timed(request, LONG_PROMPT, 2)
    if figures.get("early_first_pass"):  # whether it ran: known by now (the first request waited)
        figures["early_first_pass"] = figures["early_first_pass"].result()
    print(json.dumps({"first_token_at": first_token_at, "cpu_to_first_token_s": first_token_cpu, **figures,
                      "first_forward_s": first, "first_requests_setup_s": setup}))


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
        from ovpool.worker.gguf.model import resolve_model_path

        evict([resolve_model_path(args.model), *Path(cache_dir).glob("v1/blobs/*.blob")])
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{scenario} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"start_to_first_token_s": out.pop("first_token_at") - start, **out}


def summarize(runs: dict[str, list[dict]]) -> dict:
    words = ("outcome", "early_first_pass")
    med = {s: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k not in words}
           for s, rs in runs.items()}
    bare, hit = med["hit"], med["hit, warm-up at load"]
    cold = med["no cache"]["start_to_first_token_s"]
    start_ratio = bare["start_to_first_token_s"] / cold
    before = {"hit, early pass / no cache (start to first token)":
              med["hit, early pass"]["start_to_first_token_s"] / cold,
              "hit / no cache (process CPU to first token)":
              bare["cpu_to_first_token_s"] / med["no cache"]["cpu_to_first_token_s"]}
    if "genai" not in med:
        return {"median": med, "ratios": {"hit / no cache (start to first token)": start_ratio, **before},
                "targets_met": {"hit <= 0.15x no cache": start_ratio <= 0.15}}
    genai = med["genai"]
    genai_set_up = genai["load_s"] + genai["first_requests_setup_s"]
    ratios = {
        "hit / no cache (start to first token)": start_ratio, **before,
        "hit load, no warm-up / genai load (neither set up)": bare["load_s"] / genai["load_s"],
        "hit load with warm-up / genai load + its first-request set-up (both set up)":
            hit["load_s"] / genai_set_up,
        "hit load with warm-up / genai load (ovpool set up, genai not)": hit["load_s"] / genai["load_s"],
    }
    targets = {"hit <= 0.15x no cache": ratios["hit / no cache (start to first token)"] <= 0.15,
               "hit load <= 0.15x genai load, neither set up":
                   ratios["hit load, no warm-up / genai load (neither set up)"] <= 0.15,
               "hit load <= 0.15x genai load, both set up":
                   ratios["hit load with warm-up / genai load + its first-request set-up (both set up)"]
                   <= 0.15}
    return {"median": med, "ratios": ratios, "targets_met": targets}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="GGUF path or alias (default smollm2)")
    p.add_argument("--device", default="CPU")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--evict", action="store_true", help="drop GGUF and blob pages before each run")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-genai", dest="genai", action="store_false",
                   help="leave GenAI out (it cannot read every architecture ovpool does: gemma3)")
    p.add_argument("--child", choices=(*SCENARIOS, "populate"), help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory(prefix="ovpool-cache-bench-") as cache_dir:
        populate = run("populate", args, cache_dir)
        assert populate["outcome"] == "wrote", populate
        runs: dict[str, list[dict]] = {s: [] for s in SCENARIOS if args.genai or s != "genai"}
        for _ in range(args.repeats):
            for scenario in runs:  # interleaved, so background load hits every scenario alike
                runs[scenario].append(run(scenario, args, cache_dir))
    from ovpool.worker.graph.cpu_class import CpuInfo  # here: a child's start-up is what is timed

    summary = {"cpu": CpuInfo.read().describe(), "populate (compile + export)": populate, **summarize(runs)}
    if args.json:
        print(json.dumps({"runs": runs, **summary}, indent=2))
    else:
        print_table(summary, args)


def print_table(summary: dict, args: argparse.Namespace) -> None:
    print(f"cpu: {summary['cpu']}")
    print(f"model={args.model} device={args.device} repeats={args.repeats} evict={args.evict} (medians, s)")
    columns = (("start_to_first_token_s", "start→1st token"), ("cpu_to_first_token_s", "CPU to 1st token"),
               ("load_s", "load"),
               ("warm_up_s", "of it warm-up"), ("first_forward_s", "1st request"),
               ("first_requests_setup_s", "set-up in 1st requests"))
    print(f"{'scenario':<21}" + "".join(f"{title:>24}" for _, title in columns))
    for s, m in summary["median"].items():
        print(f"{s:<21}" + "".join(f"{m[key]:>24.2f}" for key, _ in columns))
    populate = summary["populate (compile + export)"]
    print(f"populate (compile + export): {populate['start_to_first_token_s']:.2f}")
    for name, ratio in summary["ratios"].items():
        print(f"{name}: {ratio:.3f}")
    met = summary["targets_met"]
    print("targets met: " + ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in met.items()))


if __name__ == "__main__":
    main()
