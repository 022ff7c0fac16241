"""What a change of one input's shape costs a batched decode pass on ovpool's paged runner, by the
input that changes (issue 30: is it worth keeping a pass's shapes steady?).

    .venv/bin/python benchmarks/shape_change.py [--model smollm2] [--rows 8,16] [--rounds 30]

n sequences at contexts spread over 12-135 (``batch_profile.py``'s), one token each, on an Engine's
paged runner (its one InferRequest, warmed up). Each variant X of that pass P changes one thing:
``blocks`` one more (unread) block in the last sequence's table (``block_indices`` longer, as when
a sequence crosses a block boundary); ``seqs`` one sequence fewer at the same token count (the last
two sequences' tokens in one: ``past_lens`` and the ``*_begins`` shorter); ``tokens`` one token more
(``input_ids``/``position_ids`` longer: every node's shape); ``prompts`` every sequence 24 tokens
(a prefill pass of them all, as when n requests start together). Per round: P, P, X, X, P, the last
four timed; a change costs ((X after P + P after X) - (X after X + P after P)) / 2 of the process's CPU
time. ``two requests``: P and the ``tokens`` X alternating on two InferRequests of the same compiled
model, one per shape, against one request (whether a request per shape class avoids the cost).
``padded``: 14 decodes (P) and the same with a c-token prompt chunk (X, c = 2, 4, 8: an answer tail
or a short question), alternating P, X, P, X as they do in the chat workload, against Q, X, Q, X where
Q is P padded to X's token count by a dummy sequence on the scratch block (as ovpool.worker.generate.
lone_pass pads a lone step): CPU a pass, their ratio, and whether Q's real logits rows equal P's.
Medians over rounds; the output names the CPU class and the load on every line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from ovpool import Engine
from ovpool.worker.generate.batch import feeds
from ovpool.worker.generate.pass_inputs import PassInputs
from ovpool.worker.generate.plan import Chunk
from ovpool.worker.graph.cpu_class import CpuInfo

LOW, HIGH = 12, 135
KINDS = ("blocks", "seqs", "tokens", "prompts")
PROMPT = 24  # the ``prompts`` variant's tokens a sequence


def chunks(n: int, kind: str = "") -> list[Chunk]:
    """The n-sequence decode pass, or its variant ``kind`` (see the module's docstring)."""
    out = []
    for i in range(n):
        start = LOW + (HIGH - LOW) * i // max(n - 1, 1)
        tokens = list(range(100, 100 + PROMPT)) if kind == "prompts" else [100 + i]
        blocks = list(range(i * 5, i * 5 + (start + len(tokens) - 1) // 32 + 1))  # room for 160 positions
        out.append(Chunk(str(i), start, tokens, blocks, sample=True))
    last = out[-1]
    if kind == "blocks":
        out[-1] = Chunk(last.seq_id, last.start, last.tokens, [*last.blocks, 5 * n], sample=True)
    elif kind == "seqs":
        out[-2:] = [Chunk(last.seq_id, last.start, [100, 101], last.blocks, sample=True)]
    elif kind == "tokens":
        out[-1] = Chunk(last.seq_id, last.start, [100, 101], last.blocks, sample=True)
    return out


def change_cost(run, p: list[Chunk], x: list[Chunk], rounds: int) -> tuple[float, float]:
    """(median CPU seconds of P after P, median cost of one change) over ``rounds``."""
    steady, costs = [], []
    for _ in range(rounds):
        run(p)
        pp, xp, xx, px = run(p), run(x), run(x), run(p)
        steady.append(pp)
        costs.append((xp + px - xx - pp) / 2)
    return statistics.median(steady), statistics.median(costs)


def two_requests(runner, p: list[Chunk], x: list[Chunk], rounds: int) -> tuple[float, float]:
    """Median CPU seconds of P then X: on one request, and on two (one per shape)."""
    one, a, b = (PassInputs(runner.request_on(runner.compiled)) for _ in range(3))

    def run(inputs: PassInputs, c: list[Chunk]) -> float:
        start = time.process_time()
        inputs.set(feeds(c))
        inputs.request.infer(share_outputs=True)
        return time.process_time() - start

    alone, apart = [], []
    for _ in range(rounds):
        alone.append(run(one, p) + run(one, x))
        apart.append(run(a, p) + run(b, x))
    return statistics.median(alone), statistics.median(apart)


def padded(runner, c: int, rounds: int) -> tuple[float, float, bool]:
    """(CPU a pass oscillating, padded, whether the padded pass's real rows are P's bits)."""
    p, rows = chunks(14), list(range(14))
    x = [*p, Chunk("new", 40, list(range(200, 200 + c)), [5 * 16, 5 * 16 + 1], sample=False)]
    q = [*p, Chunk("", 0, [0] * c, [runner.num_blocks], sample=False)]  # the scratch block
    same = np.array_equal(runner.forward(p, rows).copy(), runner.forward(q, rows))

    def run(c: list[Chunk]) -> float:
        start = time.process_time()
        runner.forward(c, rows if c is not x else None)
        return time.process_time() - start

    plain, steady = [], []
    for _ in range(rounds):
        run(p)
        plain.append((run(x) + run(p) + run(x)) / 3)
        run(q)
        steady.append((run(x) + run(q) + run(x)) / 3)
    return statistics.median(plain), statistics.median(steady), same


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--rows", default="8,16")
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    with Engine(args.model, settings={"attention": "paged"}) as engine:
        engine.warm_up()
        runner = engine._streams().batcher.runner
        runner.grow(5 * 16 + 2)  # room for every variant's blocks at 16 rows, and the chunk's two
        print(f"CPU class: {CpuInfo.read(engine.core).class_name}; model {args.model}")

        def run(c: list[Chunk]) -> float:
            start = time.process_time()
            runner.forward(c)
            return time.process_time() - start

        for n in (int(r) for r in args.rows.split(",")):
            for kind in KINDS:
                pass_s, cost = change_cost(run, chunks(n), chunks(n, kind), args.rounds)
                print(f"n={n:2d} {kind:6s}: pass {pass_s * 1e3:5.2f} cpu-ms, a change {cost * 1e3:+5.2f} ms"
                      f" ({cost / pass_s:+.1%} of a pass) | load {os.getloadavg()[0]:.1f}", flush=True)
            alone, apart = two_requests(runner, chunks(n), chunks(n, "tokens"), args.rounds)
            print(f"n={n:2d} tokens alternating, P+X: one request {alone * 1e3:.2f} cpu-ms, two requests"
                  f" {apart * 1e3:.2f} ({apart / alone:.3f}x) | load {os.getloadavg()[0]:.1f}", flush=True)
        for c in (2, 4, 8):
            plain, steady, same = padded(runner, c, args.rounds)
            print(f"14 decodes and a {c}-token chunk alternating: {plain * 1e3:.2f} cpu-ms a pass, padded"
                  f" {steady * 1e3:.2f} ({steady / plain:.3f}x), real rows equal: {same}"
                  f" | load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
