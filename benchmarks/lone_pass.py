"""What padding a lone decode step costs (ovpool.worker.generate.lone_pass): a one-token pass of one
sequence as PagedRunner.forward runs it (with the dummy sequence and its logits row) against the same
pass unpadded, as it ran before, paired (docs/performance.md, AMX: a padded lone pass).

    .venv/bin/python benchmarks/lone_pass.py [--model smollm2] [--contexts 12,135,1000]
        [--rounds 30] [--passes 8]

One paged runner at the engine's defaults, the decode graph off (with it a lone step takes one row
and is not padded). Per context, each round runs ``--passes`` steps of each side, in alternating
order, at the same position. Per context: the median CPU ms a step per side and the median over
rounds of padded / unpadded, CPU and wall. The output names the CPU class and load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from ovpool import Engine
from ovpool.models import resolve_model_path
from ovpool.worker.generate.batch import PagedRunner, feeds
from ovpool.worker.generate.plan import Chunk
from ovpool.worker.graph.cpu_class import CpuInfo


def step_ms(step, passes: int) -> tuple[float, float]:
    """CPU and wall ms a step."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(passes):
        step()
    return (time.process_time() - cpu) * 1e3 / passes, (time.perf_counter() - wall) * 1e3 / passes


def measure(runner: PagedRunner, context: int, rounds: int, passes: int) -> dict[str, float]:
    """Median CPU ms of a padded and an unpadded step at ``context``, and the medians of their
    per-round CPU and wall ratios."""
    blocks = list(range(-(-(context + 1) // runner.block_size)))
    runner.forward([Chunk("a", 0, [100 + i % 50 for i in range(context)], blocks, True)])
    step = Chunk("a", context, [7], blocks, True)
    unpadded = feeds([step])  # the pass as it ran before padding, on the dynamic graph
    other = runner.request_on(runner.compiled)  # the runner's own request keeps its inputs set
    sides = {"padded": lambda: runner.forward([step]),
             "unpadded": lambda: other.infer(unpadded, share_inputs=True, share_outputs=True)}
    ms = {name: [] for name in sides}
    for r in range(rounds):
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            ms[name].append(step_ms(sides[name], passes))
    pairs = list(zip(ms["padded"], ms["unpadded"], strict=True))
    return {"padded": statistics.median(p[0] for p, _ in pairs),
            "unpadded": statistics.median(u[0] for _, u in pairs),
            "cpu": statistics.median(p[0] / u[0] for p, u in pairs),
            "wall": statistics.median(p[1] / u[1] for p, u in pairs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--contexts", default="12,135,1000")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--passes", type=int, default=8)
    args = p.parse_args()
    with Engine(str(resolve_model_path(args.model)), settings={"decode_graph": "off"}) as eng:
        runner = PagedRunner(eng.paged_graph().compiled, num_blocks=128)
        print(f"cpu: {CpuInfo.read(eng.core).describe()}; {eng.graph_settings}")
        for context in (int(c) for c in args.contexts.split(",")):
            load = os.getloadavg()[0]
            m = measure(runner, context, args.rounds, args.passes)
            print(f"context {context}: padded {m['padded']:.2f} ms, unpadded {m['unpadded']:.2f} ms CPU a "
                  f"step; median padded / unpadded: CPU {m['cpu']:.3f}, wall {m['wall']:.3f} "
                  f"(load {load:.1f} -> {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
