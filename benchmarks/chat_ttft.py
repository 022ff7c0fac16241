"""The chat workload's later-turn TTFT and tokens/s, for settings side by side and GenAI, on two clocks.

    .venv/bin/python benchmarks/chat_ttft.py --side copies= --side plain=answer_copies=off
        [--genai] [--chats 8,16] [--rounds 3] [--new-tokens 32] [--turns 4] [--model smollm2]
    .venv/bin/python benchmarks/chat_ttft.py --side new= --side base@/tmp/base=   # code A/B
    .venv/bin/python benchmarks/chat_ttft.py --side ovpool= --genai --chats 16 --arrive-after 1
    .venv/bin/python benchmarks/chat_ttft.py --side new= --side base@/tmp/base= --genai --chats 16 \
        --arrive-after 1 --run 1   # ovpool bench's system prompt, so its token counts

The workload is ``ovpool bench --scenario chat``'s (ovpool.bench.workload: a ~1,000-token shared
system prompt, each turn resending the history, closed loops without pauses) on one worker's
EngineBackend (``prefix_cache=on``, ``kv_cache_mb=1024``, then each side's ``NAME=k=v,k=v``
settings; ``NAME@TREE=...`` runs that side on another checkout, e.g. a ``git worktree``), driven
step by step as benchmarks/runtime_ab.py does; ``--genai`` adds GenAI's
ContinuousBatchingPipeline with prefix caching (ovpool.bench.peers.ChatPipeline), whose clock
starts before the chat template is rendered, as ovpool's counts its worker's rendering.

Each run is a fresh subprocess; each round runs every side once per level, in rotating order.
Times are taken on two clocks: wall (perf_counter) and the process's CPU time (process_time, every
thread): load from other jobs on a shared host stretches the first, hardly the second.
``--arrive-after 1`` adds a chat's next turn after the pass that follows its answer, not between the
two: what a served worker sees of a client that sends it at once (it arrives while that pass runs and
waits for it), so its TTFT is comparable with ``ovpool bench --scenario chat``'s; the default, 0, is
the in-process best case. Reported: medians over rounds of later-turn (2+) TTFT p50/p99, its p50
split into turn 2 (the first collision: every chat's second turn arrives within a few passes) and
turns 3 on, first-turn p50, completion tokens/s, the prompt tokens a later turn computed (not from
the prefix cache), and the median paired ratios of the first side to each other.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from ovpool.bench import sides

CHILD = r"""
import json, statistics, sys, time
from ovpool.bench.stats import percentile
from ovpool.bench.workload import question, system_prompt

model, side, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[6])
n, turns, new_tokens = (int(x) for x in sys.argv[3:6])
lag = int(sys.argv[7])  # passes a chat's next turn waits before it is added (1: as a served worker sees it)
run = int(sys.argv[8]) or int(time.time() * 1000) % 10**8  # 0: a system prompt of its own, nothing cached
if int(sys.argv[8]):
    settings = {**settings, "kv_tier": "off"}  # a fixed prompt: no run finds an earlier one's blocks

def now():
    return time.perf_counter(), time.process_time()

def since(t0):
    return tuple(a - b for a, b in zip(now(), t0))

class Arrivals:
    # Next turns due after `lag` more passes; each one's clock starts when its chat's answer
    # ended, as a client's does (it sends the next turn at once).
    def __init__(self):
        self.due, self.passes = [], 0
    def later(self, ask, *args):
        self.due.append((self.passes + lag, now(), ask, args))
    def passed(self):  # after a pass's events: add what is due before the next one
        for item in [d for d in self.due if d[0] <= self.passes]:
            self.due.remove(item)
            item[2](*item[3], sent=item[1])
        self.passes += 1

def summary(ttfts, tokens, elapsed, computed):
    out = {}
    for i, clock in enumerate(("wall", "cpu")):
        later = [t[i] for turn, t in ttfts if turn > 0]
        out[f"{clock}_later_p50"] = statistics.median(later)
        out[f"{clock}_later_p99"] = percentile(later, 99)
        out[f"{clock}_turn2_p50"] = statistics.median(t[i] for turn, t in ttfts if turn == 1)
        if turns > 2:
            out[f"{clock}_turn3on_p50"] = statistics.median(t[i] for turn, t in ttfts if turn > 1)
        out[f"{clock}_first_p50"] = statistics.median(t[i] for turn, t in ttfts if turn == 0)
        out[f"{clock}_tps"] = tokens / elapsed[i]
    if computed:
        out["computed_later_p50"] = statistics.median(computed)
    return out

def ovpool_side():
    from ovpool import Engine
    from ovpool.sampling_params import SamplingParams
    from ovpool.worker.backend import EngineBackend, Failed, Finished, Token
    with Engine(model, settings={"prefix_cache": "on", "kv_cache_mb": 1024, **settings}) as eng:
        backend = EngineBackend(eng, slots=n)
        assert backend.wait_batching()
        while backend.idle():
            pass
        params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
        chats, ttfts, computed, tokens = {}, [], [], 0
        def ask(c, msgs, t, sent=None):
            msgs.append({"role": "user", "content": question(c, t)})
            chats[f"{run}-{c}-{t}"] = [c, t, msgs, sent or now(), False]
            backend.add(f"{run}-{c}-{t}", list(msgs), params)
        start = now()
        for c in range(n):
            ask(c, [{"role": "system", "content": system_prompt(run)}], 0)
        arrivals = Arrivals()
        while chats or arrivals.due:
            for ev in backend.step() if chats else []:
                assert not isinstance(ev, Failed), ev
                c, t, msgs, sent, seen = rec = chats[ev.request_id]
                if isinstance(ev, Token) and not seen:
                    rec[4] = True
                    ttfts.append((t, since(sent)))
                elif isinstance(ev, Finished):
                    del chats[ev.request_id]
                    tokens += len(ev.completion.token_ids)
                    usage = ev.completion.usage
                    if t > 0:
                        computed.append(usage.prompt_tokens - usage.cached_prompt_tokens)
                    msgs.append({"role": "assistant", "content": ev.completion.text})
                    if t + 1 < turns:
                        arrivals.later(ask, c, msgs, t + 1)
            arrivals.passed()
        return summary(ttfts, tokens, since(start), computed)

def genai_side():
    import openvino_genai as genai
    from ovpool.bench import peers
    from ovpool.worker.gguf.model import resolve_model_path
    pipe = peers.ChatPipeline(str(resolve_model_path(model)))
    config, chats, ttfts, tokens = peers._config(new_tokens), {}, [], 0
    def ask(c, msgs, t, sent=None):
        msgs.append({"role": "user", "content": question(c, t)})
        sent = sent or now()
        prompt = pipe.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
        chats[c] = [msgs, t, pipe.pipe.add_request(c * 1000 + t, prompt, config), sent, []]
    start = now()
    for c in range(n):
        ask(c, [{"role": "system", "content": system_prompt(run)}], 0)
    arrivals = Arrivals()
    while chats or arrivals.due:
        if chats:
            pipe.pipe.step()
        for c, (msgs, t, handle, sent, ids) in list(chats.items()):
            if handle.can_read():
                new = handle.read()[0].generated_ids
                if not ids and new:
                    ttfts.append((t, since(sent)))
                ids.extend(new)
            if handle.get_status() != genai.GenerationStatus.RUNNING:
                del chats[c]
                tokens += len(ids)
                msgs.append({"role": "assistant", "content": pipe.tokenizer.decode(ids)})
                if t + 1 < turns:
                    arrivals.later(ask, c, msgs, t + 1)
        arrivals.passed()
    return summary(ttfts, tokens, since(start), [])

out = genai_side() if side == "genai" else ovpool_side()
print(json.dumps({**out, "load": float(open("/proc/loadavg").read().split()[0])}))
"""

METRICS = tuple(f"{clock}_{m}" for clock in ("wall", "cpu") for m in
                ("later_p50", "later_p99", "turn2_p50", "turn3on_p50", "first_p50", "tps")
                ) + ("computed_later_p50",)


def run(args: argparse.Namespace, script: str, side: str, tree: str, settings: dict, chats: int) -> dict:
    cmd = [sys.executable, script, args.model, side, str(chats), str(args.turns), str(args.new_tokens),
           json.dumps(settings), str(args.arrive_after), str(args.run)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "PYTHONPATH": tree}, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise SystemExit(f"{side}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: dict[str, list[dict]], first: str, chats: int) -> None:
    names = list(results)
    print(f"\n{chats} chats, {len(results[first])} rounds, load {_loads(results)}")
    print(f"{'metric':20}" + "".join(f"{n:>11}" for n in names)
          + "".join(f"{first + '/' + n:>18}" for n in names[1:]))
    for key in METRICS:
        if not all(key in r for r in results[first]):
            continue
        meds = [statistics.median(r[key] for r in results[n]) if all(key in r for r in results[n]) else None
                for n in names]
        ratios = [statistics.median(a[key] / b[key] for a, b in zip(results[first], results[n], strict=True))
                  if all(key in r for r in results[n]) else None for n in names[1:]]
        print(f"{key:20}" + "".join(f"{m:11.3f}" if m is not None else f"{'-':>11}" for m in meds)
              + "".join(f"{x:18.3f}" if x is not None else f"{'-':>18}" for x in ratios))


def _loads(results: dict[str, list[dict]]) -> str:
    loads = [r["load"] for rs in results.values() for r in rs]
    return f"{min(loads):.1f}-{max(loads):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", type=sides.tree_side, action="append", required=True,
                        help="NAME[@TREE]=k=v,k=v: worker settings (on another checkout)")
    parser.add_argument("--genai", action="store_true", help="GenAI's ContinuousBatchingPipeline as a side")
    parser.add_argument("--chats", default="8,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--arrive-after", type=int, default=0, choices=(0, 1),
                        help="passes a next turn waits before it is added: 0 (between passes, as no "
                             "served client can), 1 (during the next pass, as a served worker sees it)")
    parser.add_argument("--run", type=int, default=0,
                        help="the system prompt's run number (0: a fresh one each run; another: that one, "
                             "with the KV tier off); 1 gives `ovpool bench`'s token counts, first turns of "
                             "19-21 tokens after 32 shared blocks, where the default's 8 digits give 26-28")
    parser.add_argument("--tree", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args()
    if "genai" in (s.name for s in args.side):
        parser.error("--side genai: the name of --genai's side; call yours another")
    lineup = [(s.name, s.tree or args.tree, s.settings) for s in args.side] + (
        [("genai", args.tree, {})] if args.genai else [])
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(CHILD)
    for chats in (int(x) for x in args.chats.split(",")):
        results: dict[str, list[dict]] = {name: [] for name, _, _ in lineup}
        for r in range(args.rounds):
            for name, tree, settings in lineup[r % len(lineup):] + lineup[:r % len(lineup)]:
                results[name].append(run(args, f.name, name, tree, settings, chats))
                print(f"{chats} chats, round {r}, {name}: {results[name][-1]}", file=sys.stderr, flush=True)
        table(results, lineup[0][0], chats)


if __name__ == "__main__":
    main()
