"""The chat workload replayed on the Scheduler alone, each pass priced by a cost model instead of
run: a deterministic comparison of scheduling policies, whose differences a shared host's noise
hides in live runs (benchmarks/chat_ttft.py is the live check).

    .venv/bin/python benchmarks/chat_sim.py [--pass-cost 24,32] [--tails on,off] [--apart 64,0]
        [--chats 8,16] [--turns 4] [--new-tokens 32] [--served]

The workload is chat_ttft.py's with ``--arrive-after 1``: a shared system prompt (1,025 tokens
with the template), every chat's first turn at once, each next turn added after the pass that
follows its answer and timed from the answer's end, a question of 25-33 tokens a turn, answers of
``--new-tokens`` tokens, ``prefix_cache=on`` with answer copies (and tails), 32-position blocks and the 1 GiB
KV cache of the live benchmark. A pass costs ``BASE + DECODE * decode rows + CHUNK * prompt chunks
+ TOKEN * prompt tokens`` CPU seconds: the fit of a per-pass log of chat_ttft.py's 16-chat run
(SmolLM2 at the f32 default, AMX, contexts ~1,100 tokens; docs/performance.md, Chat TTFT), its
per-token cost split into a chunk's fixed part (a 2-token chunk beside 14 decodes cost about what an
8-token one did: docs/performance.md, answer tails) and the rest. So the figures are model CPU
seconds, for policies side by side, not a measurement.
"""

from __future__ import annotations

import argparse
import itertools
import statistics

from ovpool.bench.stats import percentile
from ovpool.worker.generate.scheduler import Scheduler

BASE, DECODE, CHUNK, TOKEN = 0.027, 0.0052, 0.010, 0.0026
BLOCK, BLOCKS = 32, 728
# The workload's token counts: (shared system prompt, a question's fewest tokens, how many more it may
# have). chat_ttft.py's (an 8-digit run number in the system prompt), and ``ovpool bench``'s (run 1:
# the prompts share exactly 32 blocks, a first turn computes 19-21 tokens).
SHAPES = {"ttft": (1025, 25, 9), "served": (1024, 19, 3)}


def pass_cost(plan) -> float:
    rows = [len(c.tokens) for c in plan.chunks]
    prompt = [n for n in rows if n > 1]
    return BASE + DECODE * rows.count(1) + CHUNK * len(prompt) + TOKEN * sum(prompt)


class Replay:
    """One run of the workload on a Scheduler made with ``policy`` (its keyword arguments)."""

    def __init__(self, chats: int, turns: int, new_tokens: int, policy: dict, shape: str = "ttft"):
        self.scheduler = Scheduler(num_blocks=BLOCKS, block_size=BLOCK, prefill_chunk=256,
                                   max_running=chats, caching=True, copy_answers=True, **policy)
        self.turns, self.new_tokens, self.ids = turns, new_tokens, itertools.count(10**6)
        size, self.question = SHAPES[shape][0], SHAPES[shape][1:]
        system = [next(self.ids) for _ in range(size)]
        self.history = {c: list(system) for c in range(chats)}
        self.live: dict[str, list] = {}  # id: [chat, turn, sent, tokens so far]
        self.due: list[tuple] = []  # (pass, chat, turn, sent)
        self.ttfts: list[tuple[int, float]] = []
        self.clock, self.passes, self.tokens = 0.0, 0, 0
        for c in range(chats):
            self._ask(c, 0, 0.0)

    def _ask(self, chat: int, turn: int, sent: float) -> None:
        fewest, spread = self.question
        self.history[chat] += [next(self.ids) for _ in range(fewest + (chat * 7 + turn * 3) % spread)]
        self.scheduler.add(f"{chat}-{turn}", list(self.history[chat]))
        self.live[f"{chat}-{turn}"] = [chat, turn, sent, 0]

    def run(self) -> dict:
        while self.live or self.due:
            plan = self.scheduler.plan()
            self.clock += pass_cost(plan) if plan.chunks else 0.0
            self.scheduler.commit()
            for chunk in (c for c in plan.chunks if c.sample):
                self._sampled(chunk.seq_id)
            for item in [d for d in self.due if d[0] <= self.passes]:
                self.due.remove(item)
                self._ask(*item[1:])
            self.passes += 1
        return self._summary()

    def _sampled(self, seq_id: str) -> None:
        rec, token = self.live[seq_id], next(self.ids)
        chat, turn, sent, count = rec
        if count == 0:
            self.ttfts.append((turn, self.clock - sent))
        rec[3], self.tokens = count + 1, self.tokens + 1
        self.history[chat].append(token)
        if rec[3] < self.new_tokens:
            self.scheduler.append(seq_id, token, left=self.new_tokens - rec[3])
            return
        self.scheduler.finish(seq_id)
        del self.live[seq_id]
        self.history[chat].append(next(self.ids))  # the end-of-turn token
        if turn + 1 < self.turns:
            self.due.append((self.passes + 1, chat, turn + 1, self.clock))

    def _summary(self) -> dict:
        later = [t for turn, t in self.ttfts if turn > 0]
        return {"later_p50": statistics.median(later), "later_p99": percentile(later, 99),
                "turn2_p50": statistics.median(t for turn, t in self.ttfts if turn == 1),
                "turn3on_p50": statistics.median(t for turn, t in self.ttfts if turn > 1),
                "first_p50": statistics.median(t for turn, t in self.ttfts if turn == 0),
                "tokens_per_s": self.tokens / self.clock, "passes": self.passes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pass-cost", default="24,32", help="Scheduler pass_cost values side by side")
    p.add_argument("--tails", default="on,off", help="answer tails (Scheduler copy_tails) on, off")
    p.add_argument("--chats", default="8,16")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--apart", default="64", help="Scheduler apart values (tokens; 0: none) side by side")
    p.add_argument("--served", action="store_true", help="ovpool bench's token counts (SHAPES)")
    args = p.parse_args()
    for chats in (int(x) for x in args.chats.split(",")):
        sides = itertools.product(map(int, args.pass_cost.split(",")), args.tails.split(","),
                                  map(int, args.apart.split(",")))
        for cost, tails, apart in sides:
            policy = {"pass_cost": cost, "copy_tails": tails == "on", "apart": apart}
            r = Replay(chats, args.turns, args.new_tokens, policy, "served" if args.served else "ttft").run()
            print(f"{chats} chats, pass_cost {cost}, tails {tails}, apart {apart}: " + ", ".join(
                f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
