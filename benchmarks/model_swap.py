"""Swap time: a request for an unloaded model → its first token, through a real `ovpool serve`
with several models on a budget of one loaded (so every request for the other model swaps).

One run starts ``ovpool serve --model A --model B --max-loaded 1`` on an empty cache directory:
the first request for each model is a cold swap (read the GGUF, build, compile, export), the later
ones warm (import from the compiled-model cache); each warm swap also unloads the other model. The
time is the client's, from SUBMIT to the first streamed token, so it counts serve noticing the
queued request, the worker process's start (interpreter, OpenVINO's import), the model's load and
the first token. Beside it, what a process start alone costs (``python -c "import openvino,
ovpool.worker.engine"``), the part a worker swapping its model in place would save. ``--gap``
seconds pass before each request, so the model being unloaded has finished setting up (a model
unloaded within seconds of its load exits only once its kernel set-up and batching graph are done).

    .venv/bin/python benchmarks/model_swap.py [--models smollm2,gemma3-270m] [--rounds 3] [--gap 12]
        [--workdir DIR] [--set KEY=VALUE] [--json]

The memory of pools with 1, 2 and 3 models loaded: benchmarks/pool_memory.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from ovpool import errors
from ovpool.client import Client
from ovpool.demo import free_port
from ovpool.models import model_name


def first_token_s(client: Client, model: str) -> float:
    started = time.perf_counter()
    stream = iter(client.stream("The capital of France is", model=model, max_tokens=4, timeout=600))
    next(stream)
    elapsed = time.perf_counter() - started
    for _ in stream:
        pass
    return elapsed


def wait_for_broker(client: Client, timeout_s: float = 120.0) -> None:
    """Until the pool's broker answers (a loaded host may start it past connect_timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.status(5.0)
            return
        except errors.OvpoolError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def import_s(repeats: int = 3) -> float:
    """A worker process's fixed start: the interpreter and the engine's imports (OpenVINO)."""
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import openvino, ovpool.worker.engine"], check=True)
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def _serve_argv(port: int, workdir: Path, models: list[str], *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "ovpool", "serve", "--open", "--no-http", "--bind", f"tcp://127.0.0.1:{port}",
            "--cache-dir", str(workdir / "cache"), "--keep-alive", "-1", *extra]
    for model in models:
        argv += ["--model", model]
    return argv


def swaps(models: list[str], rounds: int, workdir: Path, gap_s: float,
          assignments: tuple[str, ...] = ()) -> dict[str, dict[str, list]]:
    """Per model: cold and warm swap times (s), and each warm swap's phases from serve's log."""
    port = free_port()
    argv = _serve_argv(port, workdir, models, "--max-loaded", "1", *(a for item in assignments
                                                                       for a in ("--set", item)))
    times: dict[str, dict[str, list]] = {model_name(m)[0]: {"cold": [], "warm": [], "marks": []}
                                         for m in models}
    with open(workdir / "serve.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        with Client(f"tcp://127.0.0.1:{port}") as client:
            wait_for_broker(client)
            for i in range(rounds + 1):
                for model in times:
                    time.sleep(gap_s)  # the loaded model has set up its kernels and graphs meanwhile
                    started = time.time()
                    times[model]["cold" if i == 0 else "warm"].append(first_token_s(client, model))
                    if i:
                        times[model]["marks"].append((started, times[model]["warm"][-1]))
    finally:
        proc.terminate()
        proc.wait(60)
    events = log_events((workdir / "serve.log").read_text(errors="replace"))
    for model, t in times.items():
        t["phases"] = [swap_phases(events, model, start, took) for start, took in t.pop("marks")]
    return times


_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) +\w+ +\S+\[(\d+)\]: (.*)$")


def log_events(text: str) -> list[tuple[float, int, str]]:
    """serve's log (its children's lines too) as (wall time, pid, message)."""
    out = []
    for line in text.splitlines():
        if m := _LINE.match(line):
            out.append((datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp(), int(m[2]), m[3]))
    return out


def swap_phases(events: list[tuple[float, int, str]], model: str, start: float, took: float) -> dict:
    """Where one warm swap of ``model`` (requested at wall time ``start``, first token ``took``
    seconds later) spent its time, from serve's log: serve noticing the request, the other model
    draining and exiting, the new worker's spawn, its start to the cache hit (interpreter,
    imports, lookup), the hit to ready (import, registration) and ready to the first token."""
    marks: dict[str, float] = {}
    worker = None
    for t, pid, text in events:
        if t < start - 0.002:
            continue
        if "notice" not in marks and text.startswith("unloading model "):
            marks["notice"] = t
        elif "loading" not in marks and text.startswith(f"loading model {model} "):
            marks["loading"] = t
        elif worker is None and text.startswith(f"worker {model}:") and " started (pid " in text:
            marks["started"], worker = t, int(re.search(r"pid (\d+)", text)[1])
        elif pid == worker and "hit" not in marks and "model cache HIT" in text:
            marks["hit"] = t
        elif "ready" not in marks and text.startswith(f"worker {model}:") and text.endswith(" is ready"):
            marks["ready"] = t
            break
    order = ["notice", "loading", "started", "hit", "ready"]
    if any(k not in marks for k in order):
        return {}
    points = [start, *(marks[k] for k in order), start + took]
    names = ["notice_s", "other_exits_s", "spawn_s", "start_to_hit_s", "hit_to_ready_s", "ready_to_token_s"]
    return {name: round(b - a, 3) for name, a, b in zip(names, points[:-1], points[1:], strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2,gemma3-270m")
    parser.add_argument("--rounds", type=int, default=3, help="warm swaps per model")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workdir", default=None, help="keep the cache and serve's log here")
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for serve (e.g. spare_worker=false), repeatable")
    parser.add_argument("--gap", type=float, default=12.0,
                        help="seconds before each request: 0 swaps back to back, so an unload may wait "
                             "for the set-up the model it unloads still runs")
    args = parser.parse_args()
    models = args.models.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        times = swaps(models, args.rounds, workdir, args.gap, tuple(args.assignments))
    start = import_s()
    result = {"cpu_count": os.cpu_count(), "process_start_s": round(start, 3), "models": {}}
    for model, t in times.items():
        cold, warm = t["cold"][0], statistics.median(t["warm"])
        result["models"][model] = {"cold_s": round(cold, 3), "warm_s": round(warm, 3),
                                   "warm_runs_s": [round(x, 3) for x in t["warm"]],
                                   "warm_over_cold": round(warm / cold, 3), "warm_phases": t["phases"]}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"process start alone (python + import openvino, ovpool.worker.engine): {start:.2f} s")
    print("| model | cold swap → first token | warm swap (cache hit) | warm / cold |")
    print("|---|---|---|---|")
    for model, r in result["models"].items():
        print(f"| {model} | {r['cold_s']:.2f} s | {r['warm_s']:.2f} s (runs {r['warm_runs_s']}) | "
              f"{r['warm_over_cold']:.2f}× |")
        for phases in r["warm_phases"]:
            print("  warm swap: " + ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in phases.items()))


if __name__ == "__main__":
    main()
