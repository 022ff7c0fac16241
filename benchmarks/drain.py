"""Issue 26's figures for draining and rolling restarts, on a real model.

    .venv/bin/python benchmarks/drain.py [--model smollm2] [--streams 16] [--tokens 200]
        [--load 8] [--load-tokens 64] [--cache-dir DIR]

1. Drain: `ovpool serve` (one worker, the HTTP API) runs ``--streams`` streams of ``--tokens``
   tokens each (ignore_eos); once each has its first token serve gets SIGTERM. Printed: how many
   streams completed with every token, the status, Retry-After and latency of a request sent
   to the HTTP API during the drain, how long serve took to exit, and the processes left behind.
2. Rolling restart: `ovpool serve --workers 2` under a constant load of ``--load`` streaming
   clients (``--load-tokens`` each, back to back) gets `ovpool restart --rolling`. Printed:
   requests done, failed and broken (a stream that did not read 0..n-1 once), and the restart's
   duration.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from ovpool import errors
from ovpool.client import Client
from ovpool.demo import free_port


def descendants(pid: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                kids.setdefault(int((entry / "stat").read_text().rsplit(")", 1)[-1].split()[1]), []).append(
                    int(entry.name))
            except (OSError, IndexError):
                continue
    found, todo = set(), [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Serve:
    def __init__(self, tmp: Path, *args: str):
        self.port, self.http = free_port(), free_port()
        self.state_file, log = tmp / "serve.json", tmp / "serve.log"
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "ovpool", "serve", "--bind", self.endpoint, "--open",
                "--http", f"127.0.0.1:{self.http}", "--state-file", str(self.state_file), *args]
        self.proc = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT)

    def state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def wait_ready(self, timeout: float = 600) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            workers = self.state().get("workers", [])
            if workers and all(w["state"] == "ready" for w in workers) and \
                    (self.state().get("http") or {}).get("state") == "ready":
                return {w["name"]: w["pid"] for w in workers}
            time.sleep(0.2)
        raise SystemExit("serve did not become ready")


def late_request(port: int) -> tuple[int, str | None, float]:
    body = json.dumps({"model": "smollm2", "prompt": "late", "max_tokens": 4}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("Retry-After"), time.perf_counter() - started
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Retry-After"), time.perf_counter() - started


def whole(indices: list[int], completion, n: int) -> bool:
    """Every token once and in order (a token without text has no PARTIAL: indices may skip),
    and the FINAL counting all ``n``."""
    return indices == sorted(set(indices)) and completion.usage.completion_tokens == n


def drain_run(args: argparse.Namespace, tmp: Path) -> None:
    serve = Serve(tmp, "--model", args.model, "--workers", "1", *args.cache)
    serve.wait_ready()
    results: list[bool] = []
    firsts = threading.Barrier(args.streams + 1)

    def one(i: int, client: Client) -> None:
        stream = client.stream(f"Story {i}: once upon a time", max_tokens=args.tokens, ignore_eos=True)
        first = next(stream)
        firsts.wait()
        indices = [first.index, *(d.index for d in stream)]
        results.append(whole(indices, stream.completion, args.tokens))

    with Client(serve.endpoint) as client:
        threads = [threading.Thread(target=one, args=(i, client)) for i in range(args.streams)]
        for t in threads:
            t.start()
        firsts.wait()
        children = descendants(serve.proc.pid)
        started = time.monotonic()
        serve.proc.send_signal(signal.SIGTERM)
        while not serve.state().get("draining"):
            time.sleep(0.01)
        status, retry, seconds = late_request(serve.http)
        for t in threads:
            t.join()
    code = serve.proc.wait(args.timeout + 60)
    exited = time.monotonic() - started
    time.sleep(1)
    print(f"drain: {sum(results)}/{args.streams} streams of {args.tokens} tokens complete; a request "
          f"during the drain: HTTP {status}, Retry-After {retry}, {seconds * 1000:.1f} ms; serve exited "
          f"{code} after {exited:.1f} s (shutdown_timeout_s {args.timeout:g}); processes left: "
          f"{sum(alive(p) for p in children)} of {len(children)}")


def rolling_run(args: argparse.Namespace, tmp: Path) -> None:
    serve = Serve(tmp, "--model", args.model, "--workers", "2", *args.cache)
    before = serve.wait_ready()
    stop, done, bad = threading.Event(), [], []

    def load(i: int) -> None:
        with Client(serve.endpoint) as client:
            n = 0
            while not stop.is_set():
                try:
                    stream = client.stream(f"Load {i}.{n}: the", max_tokens=args.load_tokens, ignore_eos=True)
                    ok = whole([d.index for d in stream], stream.completion, args.load_tokens)
                except errors.OvpoolError:
                    ok = False
                (done if ok else bad).append(1)
                n += 1

    loaders = [threading.Thread(target=load, args=(i,)) for i in range(args.load)]
    for t in loaders:
        t.start()
    time.sleep(5)
    started = time.monotonic()
    restart = subprocess.run([sys.executable, "-m", "ovpool", "restart", "--rolling", "--state-file",
                              str(serve.state_file), "--timeout", "900"], capture_output=True, text=True)
    took = time.monotonic() - started
    time.sleep(5)
    stop.set()
    for t in loaders:
        t.join()
    after = {w["name"]: w["pid"] for w in serve.state().get("workers", [])}
    serve.proc.send_signal(signal.SIGTERM)
    serve.proc.wait(args.timeout + 60)
    print(f"rolling restart of 2 workers under {args.load} streams ({args.load_tokens} tokens each): "
          f"{len(done)} requests complete, {len(bad)} failed or broken; restart took {took:.1f} s "
          f"(exit {restart.returncode}: {restart.stdout.strip().splitlines()[-1:]}); new pids: "
          f"{all(after[n] != before[n] for n in before)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--load", type=int, default=8)
    parser.add_argument("--load-tokens", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=120.0, help="shutdown_timeout_s")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--only", choices=["drain", "rolling"], default=None)
    args = parser.parse_args()
    os.environ["OVPOOL_SHUTDOWN_TIMEOUT_S"] = str(args.timeout)
    with tempfile.TemporaryDirectory() as tmp:
        args.cache = ["--cache-dir", args.cache_dir or str(Path(tmp) / "cache")]
        if args.only != "rolling":
            (Path(tmp) / "a").mkdir()
            drain_run(args, Path(tmp) / "a")
        if args.only != "drain":
            (Path(tmp) / "b").mkdir()
            rolling_run(args, Path(tmp) / "b")


if __name__ == "__main__":
    main()
