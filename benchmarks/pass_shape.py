"""What a paged-graph pass costs by its number of positions, and what a change of the pass's input
shape adds (OpenVINO's CPU plugin prepares every node again on a new shape): the figures behind
prompt lookup's ``PassCost`` (docs/prompt-lookup.md).

    .venv/bin/python benchmarks/pass_shape.py [--model smollm2] [--rounds 30]

One sequence at position 200 of an Engine's paged runner (warmed up). Per round and size n: a
one-position pass after another, an n-position pass after a one-position one, one after another
of n positions, and the one-position pass after it. Medians of the process's CPU time and of wall
time, in units of a one-position pass after another; the output names the CPU class and load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from ovpool import Engine
from ovpool.worker.generate.scheduler import Chunk
from ovpool.worker.graph.cpu_class import CpuInfo

SIZES = (2, 3, 4, 5, 6)
START = 200


def timer(runner):
    """A function running an n-position pass of one sequence: (wall, CPU) seconds."""
    blocks = list(range(-(-(START + max(SIZES)) // runner.block_size)))

    def run(n: int) -> tuple[float, float]:
        chunk = Chunk("s", START, list(range(100, 100 + n)), blocks, sample=True, draft=n - 1)
        wall, cpu = time.perf_counter(), time.process_time()
        runner.forward([chunk], rows=list(range(n)) if n > 1 else None)
        return time.perf_counter() - wall, time.process_time() - cpu

    return run


def measure(run, rounds: int) -> dict[tuple[int, int], list[tuple[float, float]]]:
    """(n, previous pass's n) -> timings."""
    out: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for n in SIZES:
            run(1)
            out.setdefault((1, 1), []).append(run(1))
            out.setdefault((n, 1), []).append(run(n))
            out.setdefault((n, n), []).append(run(n))
            out.setdefault((1, n), []).append(run(1))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"CPU class: {CpuInfo.read().class_name}; load at start: {load}; model {args.model}")
    with Engine(args.model, settings={"attention": "paged"}) as engine:
        engine.warm_up()
        timings = measure(timer(engine._streams().batcher.runner), args.rounds)
    for i, what in ((1, "CPU"), (0, "wall")):
        med = {k: statistics.median(t[i] for t in v) for k, v in timings.items()}
        one = med[(1, 1)]
        print(f"{what}: one position after one {1000 * one:.1f} ms; in those units, n positions:")
        for n in SIZES:
            print(f"  {n}: after {n} {med[(n, n)] / one:.2f}, after 1 {med[(n, 1)] / one:.2f}, "
                  f"then one position {med[(1, n)] / one:.2f}")
    print(f"load at end: {Path('/proc/loadavg').read_text().split()[0]}")


if __name__ == "__main__":
    main()
