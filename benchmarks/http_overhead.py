"""What the HTTP API adds: the same requests through `ovpool api` and through `ovpool.Client`.

    .venv/bin/python benchmarks/http_overhead.py [--workers 2] [--requests 10000] [--concurrency 64]
        [--rounds 3]                                  # null backend: requests/s, p50/p99
    .venv/bin/python benchmarks/http_overhead.py --model smollm2 --streams 8 --max-tokens 64
                                                      # SmolLM2: streamed chat tokens/s

Null backend (instant fake tokens): a broker, ``--workers`` null workers and one ``ovpool api``
process, each its own process, over loopback. Each round runs both paths, alternating which goes
first: ``--requests`` one-token non-streamed completions with ``--concurrency`` in flight (HTTP:
that many keep-alive connections from a lean single-threaded asyncio driver that writes prepared
bytes and parses only the status line and Content-Length, the way wrk would; ZeroMQ: one
``ovpool.Client`` with that many futures in flight), then ``--samples`` requests one at a time
for the round trip's p50/p99. The median round (by requests/s) is reported, and every round, with
each process's CPU per request (broker, workers, api, driver and their total: on a loaded host the
steadier measure), the CPU class and the load average at start and end.

With ``--model``: ``--streams`` concurrent streamed chat requests of ``--max-tokens`` tokens (EOS
ignored) through the HTTP API (a lean raw-HTTP reader) and through ``ovpool.AsyncClient``,
alternating, tokens/s over the whole batch and the CPU each process spent per token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from broker_overhead import cpu_seconds, latencies, throughput  # noqa: E402

from ovpool.async_client import AsyncClient  # noqa: E402
from ovpool.client import Client  # noqa: E402
from ovpool.testing.pool import PoolProcess, broker, free_endpoint, null_worker, wait_for_workers  # noqa: E402
from ovpool.worker.graph.cpu_class import CpuInfo  # noqa: E402


class LeanHttp:
    """Keep-alive HTTP/1.1 POSTs of one prepared request; only status and Content-Length parsed."""

    def __init__(self, port: int, body: dict):
        payload = json.dumps(body).encode()
        self.port = port
        self.request = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(payload)
                        + payload)

    async def _connection(self, count: int, times: list[float] | None) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            for _ in range(count):
                t = time.perf_counter()
                writer.write(self.request)
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"HTTP API answered {head[:200]!r}")
                length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
                await reader.readexactly(length)
                if times is not None:
                    times.append(time.perf_counter() - t)
        finally:
            writer.close()

    def throughput(self, total: int, concurrency: int) -> float:
        async def run() -> float:
            share, extra = divmod(total, concurrency)
            start = time.perf_counter()
            await asyncio.gather(*(self._connection(share + (i < extra), None) for i in range(concurrency)))
            return total / (time.perf_counter() - start)

        return asyncio.run(run())

    def latencies(self, samples: int) -> list[float]:
        times: list[float] = []
        asyncio.run(self._connection(samples, times))
        return times


def _summary(rps: float, lat: list[float], cpu: list[float], requests: int) -> dict:
    """One side's round; its CPU per request by process (on a 2-core host their total bounds the
    rate: 2 s of CPU a second over the total)."""
    lat = sorted(lat)
    per_request = dict(zip(("broker", "workers", "api", "driver"), (round(c / requests * 1e6) for c in cpu),
                           strict=True))
    return {"requests_per_s": round(rps), "p50_ms": round(statistics.median(lat) * 1e3, 3),
            "p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1e3, 3),
            "cpu_us_per_request": per_request | {"total": sum(per_request.values())}}


def null_rounds(args: argparse.Namespace) -> dict:
    endpoint, port = free_endpoint(), int(free_endpoint().rsplit(":", 1)[1])
    with ExitStack() as stack:
        broker_proc = stack.enter_context(broker(endpoint, "--queue-limit", str(args.requests)))
        workers = [stack.enter_context(null_worker(endpoint, slots=args.slots)) for _ in range(args.workers)]
        api = stack.enter_context(PoolProcess("api", "--broker", endpoint, "--bind", f"127.0.0.1:{port}"))
        client = stack.enter_context(Client(endpoint))
        wait_for_workers(client, args.workers)
        http = LeanHttp(port, {"model": "null", "prompt": "x", "max_tokens": args.max_tokens})
        _wait_http(http)
        pids = [broker_proc.proc.pid, *(w.proc.pid for w in workers), api.proc.pid, -1]
        sides = {"http": (http.throughput, http.latencies),
                 "zmq": (lambda n, c: throughput(client, n, c, args.max_tokens),
                         lambda n: latencies(client, n, args.max_tokens))}
        rounds: dict[str, list[dict]] = {"http": [], "zmq": []}
        for r in range(args.rounds):
            for name in (("http", "zmq") if r % 2 == 0 else ("zmq", "http")):
                run_tp, run_lat = sides[name]
                run_lat(200)  # warm
                before = cpu_seconds(pids)
                rps = run_tp(args.requests, args.concurrency)
                used = [b - a for a, b in zip(before, cpu_seconds(pids), strict=True)]
                cpu = [used[0], sum(used[1:-2]), used[-2], used[-1]]  # broker, workers, api, driver
                rounds[name].append(_summary(rps, run_lat(args.samples), cpu, args.requests))
    return {side: sorted(rs, key=lambda x: x["requests_per_s"])[len(rs) // 2] | {"rounds": rs}
            for side, rs in rounds.items()}


def _wait_http(http: LeanHttp, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            http.latencies(1)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


async def _http_streams(port: int, streams: int, max_tokens: int) -> float:
    """Streamed chat through the HTTP API, read by a lean client: raw HTTP/1.1, the SSE bytes
    kept whole and their token chunks counted at the end (the openai SDK parses every chunk into
    pydantic objects, ~0.2 ms of CPU here that a client on another host would not take from the
    worker on this one)."""

    async def one(i: int) -> int:
        body = json.dumps({"model": "", "messages": [{"role": "user", "content": f"Tell story number {i}."}],
                           "max_tokens": max_tokens, "temperature": 0, "stream": True,
                           "ignore_eos": True}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        raw = b""
        while b"data: [DONE]" not in raw[-64:]:
            data = await reader.read(65536)
            if not data:
                raise RuntimeError(f"the stream ended early: {raw[-300:]!r}")
            raw += data
        writer.close()
        return raw.count(b'"content":')  # one per token chunk; the last chunk's delta is {}

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(streams)))
    return sum(counts) / (time.perf_counter() - start)


async def _client_streams(endpoint: str, streams: int, max_tokens: int) -> float:
    async with AsyncClient(endpoint) as client:
        async def one(i: int) -> int:
            stream = client.stream([{"role": "user", "content": f"Tell story number {i}."}],
                                   max_tokens=max_tokens, ignore_eos=True)
            return len([1 async for _ in stream])

        start = time.perf_counter()
        counts = await asyncio.gather(*(one(i) for i in range(streams)))
        return sum(counts) / (time.perf_counter() - start)


def model_rounds(args: argparse.Namespace) -> dict:
    endpoint, port = free_endpoint(), int(free_endpoint().rsplit(":", 1)[1])
    with ExitStack() as stack:
        broker_proc = stack.enter_context(broker(endpoint))
        worker = stack.enter_context(PoolProcess("worker", "--broker", endpoint, "--model", args.model,
                                                 "--slots", str(args.streams)))
        api = stack.enter_context(PoolProcess("api", "--broker", endpoint, "--bind", f"127.0.0.1:{port}"))
        with Client(endpoint) as client:
            wait_for_workers(client, 1, timeout=300)
        _wait_http(LeanHttp(port, {"model": "", "prompt": "x", "max_tokens": 1}))
        asyncio.run(_http_streams(port, args.streams, 8))  # warm: kernels, the paged graph's layouts
        asyncio.run(_client_streams(endpoint, args.streams, 8))
        pids = [broker_proc.proc.pid, worker.proc.pid, api.proc.pid, -1]
        rounds: dict[str, list[float]] = {"http": [], "zmq": []}
        # CPU ms per token of the broker, the worker, the API and this process (the client).
        cpu: dict[str, list[list[float]]] = {"http": [], "zmq": []}
        for r in range(args.rounds):
            for name in (("http", "zmq") if r % 2 == 0 else ("zmq", "http")):
                run = (_http_streams(port, args.streams, args.max_tokens) if name == "http"
                       else _client_streams(endpoint, args.streams, args.max_tokens))
                before = cpu_seconds(pids)
                rounds[name].append(round(asyncio.run(run), 1))
                tokens = args.streams * args.max_tokens
                cpu[name].append([round((b - a) / tokens * 1e3, 2)
                                  for a, b in zip(before, cpu_seconds(pids), strict=True)])
    ratio = [h / z for h, z in zip(rounds["http"], rounds["zmq"], strict=True)]
    return {"tokens_per_s": rounds, "http_over_zmq_paired_median": round(statistics.median(ratio), 3),
            "cpu_ms_per_token_broker_worker_api_client": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument("--model", default=None, help="run the streamed chat comparison on this model")
    ap.add_argument("--streams", type=int, default=8)
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    result = model_rounds(args) if args.model else null_rounds(args)
    result["cpu_class"] = CpuInfo.read().class_name
    result["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]  # start, end
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
