"""``ovpool bench --scenario chat``'s first stage (one served worker, prefix cache on) for settings
side by side, alternating with GenAI's ContinuousBatchingPipeline in the same rounds.

    .venv/bin/python benchmarks/chat_served.py --side tails= --side plain=answer_tails=off --genai
        [--chats 16] [--turns 4] [--max-tokens 32] [--rounds 2] [--model smollm2]
    .venv/bin/python benchmarks/chat_served.py --side new= --side base@/tmp/base= --genai  # code A/B

Each side is a broker and one worker (``sweep.pool``, ``chat.POOL_SETS``, ``prefix_cache=on``,
then the side's ``NAME=k=v,k=v`` settings; ``NAME@TREE=...`` runs its broker and worker on another
checkout's ``ovpool``, e.g. a ``git archive`` of an older commit), started once; each round runs the workload
(ovpool.bench.chat.run_pool: closed loops, a fresh system prompt a run) on every side in rotating
order, then on GenAI (ovpool.bench.peers.ChatPipeline). Wall clock only, as the bench reports it:
later-turn (2+) TTFT p50/p99, per-turn medians, tokens/s, and the median per-round ratios of the
first side to each other side.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
from contextlib import ExitStack

from ovpool.bench import chat, peers, sides, sweep
from ovpool.models import resolve_model_path

KEYS = ("ttft_later_turns_median_s", "ttft_later_turns_p99_s", "tokens_per_s")


def row(r: dict) -> str:
    turns = "/".join(f"{v:.3f}" for v in r["ttft_median_s_by_turn"].values())
    return (f"later p50 {r['ttft_later_turns_median_s']:.3f} s, p99 {r['ttft_later_turns_p99_s']:.3f} s, "
            f"turns {turns} s, {r['tokens_per_s']:.1f} tok/s")


def say(i: int, name: str, r: dict) -> None:
    print(f"round {i + 1} {name}: {row(r)}  load {os.getloadavg()[0]:.1f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", type=sides.tree_side, action="append", required=True,
                   help="NAME[@TREE]=k=v,k=v: worker settings")
    p.add_argument("--genai", action="store_true")
    p.add_argument("--chats", type=int, default=16)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--model", default="smollm2")
    args = p.parse_args()
    named = {s.name: s for s in args.side}
    if "genai" in named:
        p.error("--side: the name 'genai' is GenAI's (--genai)")
    if any(s.tree for s in args.side):
        os.chdir(tempfile.gettempdir())  # `python -m ovpool` would find the working directory's first
    runs: dict[str, list[dict]] = {name: [] for name in [*named, *(["genai"] if args.genai else [])]}
    counter = itertools.count(1)
    with ExitStack() as stack:
        base = (*chat.POOL_SETS, "prefix_cache=on")
        clients = {name: stack.enter_context(sweep.pool(
            args.model, args.chats, sets=(*base, *s.assignments),
            env={**chat.POOL_ENV, **({"PYTHONPATH": s.tree} if s.tree else {})}))
            for name, s in named.items()}
        pipe = peers.ChatPipeline(str(resolve_model_path(args.model))) if args.genai else None
        for i in range(args.rounds):
            order = list(named)[i % len(named):] + list(named)[:i % len(named)]
            for name in order:
                runs[name].append(chat.run_pool(clients[name], next(counter), args.chats, args.turns,
                                                args.max_tokens))
                say(i, name, runs[name][-1])
            if pipe is not None:
                runs["genai"].append(pipe.run(next(counter), args.chats, args.turns, args.max_tokens))
                say(i, "genai", runs["genai"][-1])
    first = list(named)[0]
    for other in [n for n in runs if n != first]:
        ratios = {k: statistics.median(a[k] / b[k] for a, b in zip(runs[first], runs[other], strict=True))
                  for k in KEYS}
        print(f"{first} / {other} (median of per-round ratios): "
              + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    kept = (*KEYS, "ttft_median_s_by_turn")
    print(json.dumps({n: [{k: r[k] for k in kept} for r in v] for n, v in runs.items()}))


if __name__ == "__main__":
    main()
