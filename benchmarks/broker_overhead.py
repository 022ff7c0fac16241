"""Broker overhead with null-engine workers: requests/s routed and added latency per request.

A null worker answers instantly (no model), so everything measured is the pool itself: driver
-> broker -> worker process -> broker -> driver, over loopback TCP, in separate processes.

    .venv/bin/python benchmarks/broker_overhead.py [--workers 2] [--requests 20000] [--window 512]
        [--client lean|full]

The load comes from a lean single-threaded driver on a raw DEALER socket (``--client lean``, see
broker_driver.py) or from ``ovpool.Client`` with its I/O thread (``--client full``).
Throughput: ``--requests`` requests with up to ``--window`` outstanding (pipelined).
Latency: ``--samples`` requests one at a time; with a null engine the whole round trip is
overhead, so its p50/p99 bound what the pool adds to a real generation.

``--stream``: aggregate streamed tokens/s instead, through the broker from null workers with no
token delay (they generate as fast as the flow control lets them) to one lean reader that returns
credit as it reads, for 1, 8, 64 and 256 concurrent streams of ``--stream-tokens`` each: how many
tokens/s one broker carries, and where it saturates.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from broker_driver import LeanDriver

from ovpool.client import Client
from ovpool.testing.pool import broker, free_endpoint, null_worker, wait_for_workers


class FullClient:
    """The same two phases through ``ovpool.Client`` (what an application would use)."""

    def __init__(self, client: Client, max_tokens: int):
        self.client = client
        self.max_tokens = max_tokens

    def throughput(self, total: int, window: int) -> float:
        return throughput(self.client, total, window, self.max_tokens)

    def latencies(self, samples: int) -> list[float]:
        return latencies(self.client, samples, self.max_tokens)


def throughput(client: Client, total: int, window: int, max_tokens: int) -> float:
    """Requests/s with up to ``window`` in flight (a semaphore, not wait(): that is O(window))."""
    room, failures = threading.Semaphore(window), []

    def done(future) -> None:
        if future.exception() is not None:
            failures.append(future.exception())
        room.release()

    start = time.perf_counter()
    for _ in range(total):
        room.acquire()
        client.submit("x", max_tokens=max_tokens).add_done_callback(done)
    for _ in range(window):
        room.acquire()
    elapsed = time.perf_counter() - start
    if failures:
        raise failures[0]
    return total / elapsed


def latencies(client: Client, samples: int, max_tokens: int) -> list[float]:
    out = []
    for _ in range(samples):
        t = time.perf_counter()
        client.complete("x", max_tokens=max_tokens)
        out.append(time.perf_counter() - t)
    return out


def cpu_seconds(pids: list[int]) -> list[float]:
    """User+system CPU seconds of each process (Linux /proc; -1 for this process via getrusage)."""
    out = []
    for pid in pids:
        if pid == -1:
            r = resource.getrusage(resource.RUSAGE_SELF)
            out.append(r.ru_utime + r.ru_stime)
            continue
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def measure(args: argparse.Namespace) -> dict:
    endpoint = free_endpoint()
    with ExitStack() as stack:
        broker_proc = stack.enter_context(broker(endpoint, "--queue-limit", str(args.requests)))
        workers = [stack.enter_context(null_worker(endpoint, slots=args.slots)) for _ in range(args.workers)]
        client = stack.enter_context(Client(endpoint))
        wait_for_workers(client, args.workers)
        if args.client == "lean":
            client.close()  # its I/O thread would share the driver's CPU
            driver = stack.enter_context(LeanDriver(endpoint, args.max_tokens))
        else:
            driver = FullClient(client, args.max_tokens)
        driver.latencies(200)  # warm up connections and caches
        pids = [broker_proc.proc.pid, *(w.proc.pid for w in workers), -1]
        before = cpu_seconds(pids)
        rps = driver.throughput(args.requests, args.window)
        used = [b - a for a, b in zip(before, cpu_seconds(pids), strict=True)]
        lat = sorted(driver.latencies(args.samples))
    per_request = [round(u / args.requests * 1e6) for u in used]
    return {"client": args.client, "workers": args.workers, "requests": args.requests, "window": args.window,
            "max_tokens": args.max_tokens, "requests_per_s": round(rps),
            "latency_p50_ms": round(statistics.median(lat) * 1e3, 3),
            "latency_p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1e3, 3),
            # CPU per routed request: what an idle machine would allow, whatever else runs here.
            "cpu_us_per_request": {"broker": per_request[0], "workers": sum(per_request[1:-1]),
                                   "client": per_request[-1]},
            "load_average": os.getloadavg()[0]}


def measure_streams(args: argparse.Namespace) -> dict:
    endpoint = free_endpoint()
    rates = {}
    with ExitStack() as stack:
        broker_proc = stack.enter_context(broker(endpoint))
        workers = [stack.enter_context(null_worker(endpoint, slots=256)) for _ in range(args.workers)]
        with Client(endpoint) as client:
            wait_for_workers(client, args.workers)
        driver = stack.enter_context(LeanDriver(endpoint, 1))
        driver.stream(8, 500)  # warm up
        pids = [broker_proc.proc.pid, *(w.proc.pid for w in workers), -1]
        for streams in (1, 8, 64, 256):
            before = cpu_seconds(pids)
            rate = driver.stream(streams, args.stream_tokens)
            used = [b - a for a, b in zip(before, cpu_seconds(pids), strict=True)]
            tokens = streams * args.stream_tokens
            rates[streams] = {"tokens_per_s": round(rate),
                              "cpu_us_per_token": {"broker": round(used[0] / tokens * 1e6, 2),
                                                   "workers": round(sum(used[1:-1]) / tokens * 1e6, 2),
                                                   "reader": round(used[-1] / tokens * 1e6, 2)}}
    return {"workers": args.workers, "stream_tokens": args.stream_tokens, "streams": rates,
            "load_average": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument("--client", choices=["lean", "full"], default="lean",
                    help="lean: single-threaded raw-socket driver; full: ovpool.Client")
    ap.add_argument("--stream", action="store_true", help="aggregate streamed tokens/s instead")
    ap.add_argument("--stream-tokens", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.stream:
        r = measure_streams(args)
        print(json.dumps(r) if args.json else "\n".join(
            f"{n:>4} streams: {v['tokens_per_s']} tokens/s; CPU per token (us): {v['cpu_us_per_token']}"
            for n, v in r["streams"].items()) + f"\nload average {r['load_average']:.1f}")
        return
    r = measure(args)
    print(json.dumps(r) if args.json else
          f"{r['requests_per_s']} requests/s routed ({args.workers} null workers, window {args.window},"
          f" {args.client} client);"
          f" round trip p50 {r['latency_p50_ms']} ms, p99 {r['latency_p99_ms']} ms;"
          f" CPU per request (us): {r['cpu_us_per_request']}; load average {r['load_average']:.1f}")


if __name__ == "__main__":
    main()
