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

``--llamacpp``: llama.cpp's swap in the same run, on the same GGUF files (benchmarks/llamacpp_server.py:
llama-cpp-python's server holding one model, loading the one a request names). Its request follows
each of ovpool's, after the same gap; from the second round on each is a swap, and each warm
ovpool swap is paired with the llama.cpp swap of its round and model (median of the ratios).

    .venv/bin/python benchmarks/model_swap.py [--models smollm2,gemma3-270m] [--rounds 3] [--gap 12]
        [--llamacpp] [--workdir DIR] [--set KEY=VALUE] [--json]

The memory of pools with 1, 2 and 3 models loaded: benchmarks/pool_memory.py.
"""

from __future__ import annotations

import argparse
import contextlib
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp_server  # noqa: E402
from llamacpp_server import LlamaCppServer  # noqa: E402

from ovpool import errors  # noqa: E402
from ovpool.client import Client  # noqa: E402
from ovpool.demo import free_port  # noqa: E402
from ovpool.models import model_name, resolve_model_path  # noqa: E402


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


def swaps(models: list[str], rounds: int, workdir: Path, gap_s: float, assignments: tuple[str, ...] = (),
          peer: LlamaCppServer | None = None) -> dict[str, dict[str, list]]:
    """Per model: cold and warm swap times (s), each warm swap's phases from serve's log, and with
    ``peer`` its swaps (s) from the second round on."""
    port = free_port()
    argv = _serve_argv(port, workdir, models, "--max-loaded", "1", *(a for item in assignments
                                                                       for a in ("--set", item)))
    times: dict[str, dict[str, list]] = {model_name(m)[0]: {"cold": [], "warm": [], "marks": [], "peer": []}
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
                    if peer is not None:
                        time.sleep(gap_s)  # ovpool's new worker sets its batching graph up meanwhile
                        took = peer.first_token_s(model)
                        if i:  # the first round: the peer's first model was loaded at its start
                            times[model]["peer"].append(took)
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
    for t, pid, text in sorted(events):  # serve's lines and its children's interleave late
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


def summary(times: dict[str, dict[str, list]]) -> dict[str, dict]:
    """Per model: the cold swap, the median warm one, their ratio, and with a peer its median swap
    and the median of the paired ratios (ovpool warm / peer, same round)."""
    out = {}
    for model, t in times.items():
        cold, warm = t["cold"][0], statistics.median(t["warm"])
        r = {"cold_s": round(cold, 3), "warm_s": round(warm, 3),
             "warm_runs_s": [round(x, 3) for x in t["warm"]], "warm_over_cold": round(warm / cold, 3),
             "warm_phases": t["phases"]}
        if t["peer"]:
            r["llamacpp_runs_s"] = [round(x, 3) for x in t["peer"]]
            r["llamacpp_s"] = round(statistics.median(t["peer"]), 3)
            r["warm_over_llamacpp"] = round(statistics.median(
                w / p for w, p in zip(t["warm"], t["peer"], strict=False)), 3)
        out[model] = r
    return out


def print_table(result: dict) -> None:
    print("process start alone (python + import openvino, ovpool.worker.engine): "
          f"{result['process_start_s']:.2f} s; load {result['load'][0]:.1f} → {result['load'][1]:.1f}")
    peer = any("llamacpp_s" in r for r in result["models"].values())
    print("| model | cold swap → first token | warm swap (cache hit) | warm / cold |"
          + (" llama.cpp swap | warm / llama.cpp |" if peer else ""))
    print("|---|---|---|---|" + ("---|---|" if peer else ""))
    for model, r in result["models"].items():
        print(f"| {model} | {r['cold_s']:.2f} s | {r['warm_s']:.2f} s (runs {r['warm_runs_s']}) | "
              f"{r['warm_over_cold']:.2f}× |" + (f" {r['llamacpp_s']:.2f} s (runs {r['llamacpp_runs_s']}) | "
                                                  f"{r['warm_over_llamacpp']:.2f}× |" if peer else ""))
        for phases in r["warm_phases"]:
            print("  warm swap: " + ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in phases.items()))


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
    parser.add_argument("--llamacpp", action="store_true", help="llama.cpp's swap in the same run")
    args = parser.parse_args()
    models = args.models.split(",")
    if args.llamacpp and not llamacpp_server.available():
        sys.exit("error: --llamacpp needs llama-cpp-python[server] (pip install 'llama-cpp-python[server]')")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        peer = None
        if args.llamacpp:
            files = {model_name(m)[0]: str(resolve_model_path(model_name(m)[1])) for m in models}
            peer = stack.enter_context(llamacpp_server.LlamaCppServer(files, workdir))
        times = swaps(models, args.rounds, workdir, args.gap, tuple(args.assignments), peer)
    result = {"cpu_count": os.cpu_count(), "load": [load_before, os.getloadavg()[0]],
              "process_start_s": round(import_s(), 3), "models": summary(times)}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
