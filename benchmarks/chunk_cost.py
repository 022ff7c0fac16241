"""What a small prompt chunk adds to a batched decode pass: the price of a copy riding on decodes
(answer copies, answer tails; docs/performance.md, Chat TTFT: answer tails).

    .venv/bin/python benchmarks/chunk_cost.py [--model smollm2] [--decodes 14] [--context 1100]
        [--rounds 12]

One paged runner at the engine's defaults; a context of ``--context`` tokens is computed once and
every sequence of the passes reads it (they share its blocks, each writing its own last one: the
values do not matter, the shapes do). Each round runs every case once, in order: ``--decodes``
one-token rows alone, then with one or more prompt chunks of n tokens ending inside the context's
last block. Per case: the median over rounds of the process's CPU ms and wall ms a pass, and the CPU
ms over the decodes alone. The output names the CPU class and load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from ovpool import Engine
from ovpool.models import resolve_model_path
from ovpool.worker.generate.batch import PagedRunner
from ovpool.worker.generate.plan import Chunk
from ovpool.worker.graph.cpu_class import CpuInfo

CASES = {"decodes alone": (), "+ 2 tokens": (2,), "+ 4 x 2 tokens": (2, 2, 2, 2), "+ 8 tokens": (8,),
         "+ 16 tokens": (16,), "+ 32 tokens": (32,)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--decodes", type=int, default=14)
    p.add_argument("--context", type=int, default=1100)
    p.add_argument("--rounds", type=int, default=12)
    args = p.parse_args()
    with Engine(str(resolve_model_path(args.model))) as eng:
        runner = PagedRunner(eng.paged_graph().compiled, kv_cache_mb=256)
        size, ctx = runner.block_size, args.context
        shared = list(range(-(-ctx // size)))  # the context's blocks
        for start in range(0, ctx, 256):
            n = min(256, ctx - start)
            runner.forward([Chunk("p", start, [100 + (start + i) % 500 for i in range(n)], shared, True)])
        spare = iter(range(len(shared), runner.num_blocks))
        decodes = [Chunk(f"d{i}", ctx, [200 + i], [*shared[:-1], next(spare)], True)
                   for i in range(args.decodes)]
        last = (ctx - 1) // size * size  # the chunks end inside the context's last block, as a tail does
        cases = {name: decodes + [Chunk(f"c{j}", min(last + 2 * j, ctx - n), list(range(300, 300 + n)),
                                        [*shared[:-1], next(spare)], False) for j, n in enumerate(sizes)]
                 for name, sizes in CASES.items()}
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, chunks in cases.items():
                cpu, wall = time.process_time(), time.perf_counter()
                runner.forward(chunks)
                times[name].append((time.process_time() - cpu, time.perf_counter() - wall))
    alone = statistics.median(c for c, _ in times["decodes alone"])
    print(f"{args.model}, {args.decodes} decodes over {ctx} positions, {CpuInfo.read().class_name}, "
          f"load {os.getloadavg()[0]:.1f}, median of {args.rounds} rounds")
    for name, v in times.items():
        cpu, wall = statistics.median(c for c, _ in v), statistics.median(w for _, w in v)
        print(f"  {name:16s} CPU {cpu * 1e3:6.1f} ms (+{(cpu - alone) * 1e3:5.1f}), "
              f"wall {wall * 1e3:6.1f} ms")


if __name__ == "__main__":
    main()
