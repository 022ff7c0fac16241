"""The HTTP API's CPU per request, two trees side by side: one `ovpool api` process from each.

    .venv/bin/python benchmarks/http_api_pair.py BEFORE_DIR AFTER_DIR [--pairs 10] [--requests 5000]

BEFORE_DIR and AFTER_DIR are checkouts (e.g. ``git archive <commit> | tar -x -C DIR``). One broker
and ``--workers`` null workers (this process's ovpool) serve both API processes, each started
with ``PYTHONPATH=<its dir>``; bursts of ``--requests`` one-token completions from the lean
keep-alive driver of http_overhead.py alternate between them (ABBA...), so both sides see the same
host load within seconds. Reported: each burst's requests/s and the API process's CPU per request
(all its threads: the event loop's and libzmq's I/O thread), and per pair after/before, with the
median. On a loaded host the CPU ratio is the steadier measure; requests/s follows the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from broker_overhead import cpu_seconds
from http_overhead import LeanHttp, _wait_http

from ovpool.client import Client
from ovpool.testing.pool import PoolProcess, broker, free_endpoint, null_worker, wait_for_workers
from ovpool.worker.graph.cpu_class import CpuInfo


def _check_tree(tree: Path) -> None:
    """The ovpool a child with PYTHONPATH=tree imports is the tree's (not the cwd's, not the venv's)."""
    found = subprocess.check_output([sys.executable, "-c", "import ovpool; print(ovpool.__file__)"],
                                    env={**os.environ, "PYTHONPATH": str(tree)}, text=True).strip()
    if not Path(found).is_relative_to(tree):
        sys.exit(f"{tree}: a child imports ovpool from {found}, not from this tree")


def _burst(http: LeanHttp, pid: int, requests: int, concurrency: int) -> tuple[int, float]:
    before = cpu_seconds([pid])[0]
    rps = http.throughput(requests, concurrency)
    return round(rps), round((cpu_seconds([pid])[0] - before) / requests * 1e6, 1)


def run(args: argparse.Namespace) -> dict:
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for tree in trees.values():
        _check_tree(tree)
    endpoint = free_endpoint()
    bursts: dict[str, list[tuple[int, float]]] = {"before": [], "after": []}
    with ExitStack() as stack:
        stack.enter_context(broker(endpoint, "--queue-limit", str(args.requests)))
        for _ in range(args.workers):
            stack.enter_context(null_worker(endpoint, slots=args.slots))
        sides = {}
        for name, tree in trees.items():
            port = int(free_endpoint().rsplit(":", 1)[1])
            api = stack.enter_context(PoolProcess("api", "--broker", endpoint, "--bind", f"127.0.0.1:{port}",
                                                  env={"PYTHONPATH": str(tree)}))
            sides[name] = (LeanHttp(port, {"model": "null", "prompt": "x", "max_tokens": 1}), api.proc.pid)
        wait_for_workers(stack.enter_context(Client(endpoint)), args.workers)
        for http, _ in sides.values():
            _wait_http(http)
            http.latencies(1000)  # warm
        for p in range(args.pairs):
            for name in (("before", "after") if p % 2 == 0 else ("after", "before")):
                bursts[name].append(_burst(*sides[name], args.requests, args.concurrency))
    cpu = [a[1] / b[1] for b, a in zip(bursts["before"], bursts["after"], strict=True)]
    rps = [a[0] / b[0] for b, a in zip(bursts["before"], bursts["after"], strict=True)]
    return {"trees": {k: str(v) for k, v in trees.items()},
            "api_cpu_us_per_request": {k: [b[1] for b in v] for k, v in bursts.items()},
            "requests_per_s": {k: [b[0] for b in v] for k, v in bursts.items()},
            "api_cpu_after_over_before": {"median": round(statistics.median(cpu), 3),
                                          "range": [round(min(cpu), 3), round(max(cpu), 3)]},
            "requests_per_s_after_over_before_median": round(statistics.median(rps), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=256)
    args = ap.parse_args()
    os.chdir(tempfile.gettempdir())  # `python -m ovpool` puts the cwd first on sys.path: not a checkout
    load_before = os.getloadavg()[0]
    result = run(args)
    result["cpu_class"] = CpuInfo.read().class_name
    result["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]  # start, end
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
