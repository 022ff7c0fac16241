"""Issue 26's figure for a standby broker pair: how long streams stall when the active broker dies.

    .venv/bin/python benchmarks/standby_failover.py [--streams 8] [--tokens 200] [--delay 0.03]
        [--signal KILL|TERM] [--repeats 3]

Two ``ovpool broker`` processes (primary, backup) and one null worker (``--delay`` s a token)
that knows both; ``--streams`` streams of ``--tokens`` tokens through one Client that knows both.
Once every stream has 10 tokens the primary gets ``--signal``. Printed per run: streams complete
and exact (indices 0..n-1 once), and the longest gap between two tokens of a stream (the
failover as a reader sees it), at the pool's default heartbeat interval unless
OVPOOL_HEARTBEAT_INTERVAL_S says otherwise.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import threading
import time

from ovpool.client import Client
from ovpool.testing.pool import broker, free_endpoint, null_worker, wait_for_workers


def run(args: argparse.Namespace) -> tuple[int, float]:
    a, b, sa, sb = (free_endpoint() for _ in range(4))
    both = f"{a},{b}"
    with broker(a, "--role", "primary", "--peer", sb, "--peer-bind", sa) as primary, \
            broker(b, "--role", "backup", "--peer", sa, "--peer-bind", sb), \
            null_worker(both, slots=args.streams, token_delay=args.delay), Client(both) as client:
        wait_for_workers(client, 1, timeout=60)
        started = threading.Barrier(args.streams + 1)
        gaps, exact = [0.0] * args.streams, [False] * args.streams

        def read(i: int) -> None:
            indices, last = [], None
            for delta in client.stream(f"s{i}", max_tokens=args.tokens, seed=i, ignore_eos=True):
                now = time.monotonic()
                gaps[i] = max(gaps[i], now - last) if last is not None else 0.0
                last = now
                indices.append(delta.index)
                if len(indices) == 10:
                    started.wait()
            exact[i] = indices == list(range(args.tokens))

        threads = [threading.Thread(target=read, args=(i,)) for i in range(args.streams)]
        for t in threads:
            t.start()
        started.wait()
        primary.proc.send_signal(getattr(signal, f"SIG{args.signal}"))
        for t in threads:
            t.join()
    return sum(exact), max(gaps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--delay", type=float, default=0.03)
    ap.add_argument("--signal", choices=["KILL", "TERM"], default="KILL")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    stalls = []
    for r in range(args.repeats):
        done, stall = run(args)
        stalls.append(stall)
        print(f"run {r + 1}: {done}/{args.streams} streams exact, longest stall {stall:.2f} s")
    print(f"SIG{args.signal}: median longest stall {statistics.median(stalls):.2f} s, {args.repeats} runs")


if __name__ == "__main__":
    main()
