"""Two source trees' worker execution paths, alternated: single-stream TTFT and decode tokens/s
(``Engine.complete``) and 8 concurrent requests (``EngineBackend``, continuous batching).

    .venv/bin/python benchmarks/runtime_ab.py --tree new=/work/main --tree base=/work/base
        [--model smollm2] [--rounds 3] [--prompt-tokens 256] [--new-tokens 64]
        [--chat 1,8,16 [--turns 4] [--genai]]

``--chat LEVELS``: instead, the chat workload (ovpool.bench.workload: a ~1,000-token shared system
prompt, each turn resending the history) at each number of concurrent chats, closed loops driven
step by step on one worker's EngineBackend (prefix_cache=on, no HTTP): TTFT p50/p99 of turns 2 and
later, of first turns, and completion tokens/s; ``--genai`` adds GenAI's ContinuousBatchingPipeline
with prefix caching (ovpool.bench.peers.ChatPipeline) as a third side of each round.

Each round runs every tree once, in a fresh subprocess with that tree first on PYTHONPATH (and the
working directory elsewhere, so the editable install does not shadow it); which tree goes first
alternates. A subprocess loads the engine (through the compiled-model cache), warms it up, then
times single streams on fresh prompts (no prefix-cache hit) and one batch of 8. Reported: the
median over rounds of each side's best-of-round, and the median paired ratio new/base.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
import numpy as np
from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.worker.backend import EngineBackend, Finished, Failed

model, prompt_tokens, new_tokens, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(int(time.time() * 1e6) % 2**32)
def prompt():  # ordinary token ids, fresh each time: no prefix-cache hit
    return [int(t) for t in rng.integers(1000, 20000, prompt_tokens)]
out = {"tree": __import__("ovpool").__file__}
with Engine(model) as eng:
    eng.warm_up()
    eng.complete(prompt(), max_tokens=8, ignore_eos=True)
    single = [eng.complete(prompt(), max_tokens=new_tokens, ignore_eos=True).timings for _ in range(reps)]
    out["ttft_s"] = min(t["ttft_s"] for t in single)
    out["decode_tps"] = max(t["decode_tps"] for t in single)
    backend = EngineBackend(eng, slots=8)
    assert backend.wait_batching()
    backend.idle()
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    for i in range(8):
        backend.add(str(i), prompt(), params)
    done = {}
    while backend.active:
        for ev in backend.step():
            assert not isinstance(ev, Failed), ev
            if isinstance(ev, Finished):
                done[ev.request_id] = ev.completion
    wall = time.perf_counter() - start
    out["c8_tps"] = sum(len(c.token_ids) for c in done.values()) / wall
    out["c8_ttft_s"] = sorted(c.timings["ttft_s"] for c in done.values())[4]
print(json.dumps(out))
"""

CHAT_CHILD = r"""
import json, sys, time
from ovpool.bench.workload import ChatRun, Turn, question, system_prompt
model, levels, turns, new_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
levels = [int(x) for x in levels.split(",")]
run = int(time.time() * 1000) % 10**8  # a system prompt of its own: nothing cached from before

def summary(out, n):  # ChatRun.summary's figures, as genai_side takes them from its ChatRun
    s = out.summary()
    return {f"c{n}_later_p50": s["ttft_later_turns_median_s"], f"c{n}_later_p99": s["ttft_later_turns_p99_s"],
            f"c{n}_first_p50": s["ttft_median_s_by_turn"].get("1"), f"c{n}_tps": s["tokens_per_s"]}

def ovpool_side():
    from ovpool import Engine
    from ovpool.sampling_params import SamplingParams
    from ovpool.worker.backend import EngineBackend, Failed, Finished, Token
    out = {"tree": __import__("ovpool").__file__}
    with Engine(model, settings={"prefix_cache": "on", "kv_cache_mb": 1024}) as eng:
        backend = EngineBackend(eng, slots=max(levels))
        assert backend.wait_batching()
        while backend.idle():
            pass
        params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
        for n in levels:
            rec, chats = ChatRun(), {}
            def ask(c, msgs, t):
                msgs.append({"role": "user", "content": question(c, t)})
                rid = f"{run}-{n}-{c}-{t}"
                backend.add(rid, list(msgs), params)
                chats[rid] = (Turn(c, t), msgs, time.perf_counter())
            for c in range(n):
                ask(c, [{"role": "system", "content": system_prompt(run + n)}], 0)
            t0 = time.perf_counter()
            while chats:
                events, now = backend.step(), time.perf_counter()
                for ev in events:
                    assert not isinstance(ev, Failed), ev
                    turn, msgs, sent = chats[ev.request_id]
                    if isinstance(ev, Token) and turn.ttft_s is None:
                        turn.ttft_s = now - sent
                    elif isinstance(ev, Finished):
                        del chats[ev.request_id]
                        rec.turns.append(turn)
                        rec.completion_tokens += len(ev.completion.token_ids)
                        msgs.append({"role": "assistant", "content": ev.completion.text})
                        if turn.turn + 1 < turns:
                            ask(turn.conversation, msgs, turn.turn + 1)
            rec.wall_s = time.perf_counter() - t0
            out.update(summary(rec, n))
    return out

def genai_side():
    from ovpool.bench import peers
    from ovpool.worker.gguf.model import resolve_model_path
    pipe = peers.ChatPipeline(str(resolve_model_path(model)))
    out = {"tree": "genai"}
    for n in levels:
        res = pipe.run(run + n, n, turns, new_tokens)
        out[f"c{n}_later_p50"] = res["ttft_later_turns_median_s"]
        out[f"c{n}_later_p99"] = res["ttft_later_turns_p99_s"]
        out[f"c{n}_first_p50"] = res["ttft_median_s_by_turn"].get("1")
        out[f"c{n}_tps"] = res["tokens_per_s"]
    return out

print(json.dumps(genai_side() if sys.argv[5] == "genai" else ovpool_side()))
"""

METRICS = (("ttft_s", "single TTFT (s)"), ("decode_tps", "single decode (tok/s)"),
           ("c8_tps", "8 concurrent (tok/s, all)"), ("c8_ttft_s", "8 concurrent TTFT p50 (s)"))


def run(tree: str, args: argparse.Namespace, script: str) -> dict:
    env = {**os.environ, "PYTHONPATH": tree if tree != "genai" else args.genai_tree}
    if args.chat:
        cmd = [sys.executable, script, args.model, args.chat, str(args.turns), str(args.new_tokens),
               "genai" if tree == "genai" else "ovpool"]
    else:
        cmd = [sys.executable, script, args.model, str(args.prompt_tokens), str(args.new_tokens),
               str(args.reps)]
    proc = subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH; the first is 'new'")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--chat", help="concurrent chats, e.g. 1,8,16: the chat workload instead")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--genai", action="store_true", help="with --chat: GenAI as a third side")
    args = parser.parse_args()
    trees = [t.split("=", 1) for t in args.tree]
    args.genai_tree = trees[0][1]
    if args.genai:
        trees.append(["genai", "genai"])
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(CHAT_CHILD if args.chat else CHILD)
    results: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        for name, path in order:
            results[name].append(run(path, args, f.name))
            print(f"round {r} {name}: {results[name][-1]}", file=sys.stderr, flush=True)
    metrics = METRICS if not args.chat else [
        (f"c{n}_{k}", f"{n} chats {label}") for n in args.chat.split(",")
        for k, label in (("later_p50", "TTFT turns 2+ p50 (s)"), ("later_p99", "TTFT turns 2+ p99 (s)"),
                         ("first_p50", "TTFT turn 1 p50 (s)"), ("tps", "tokens/s"))]
    a = trees[0][0]
    for b, _ in trees[1:]:
        table(results, metrics, a, b)


def table(results: dict[str, list[dict]], metrics, a: str, b: str) -> None:
    """Medians over rounds of each side, and the median paired ratio a/b."""
    print(f"{'metric':34} {a:>10} {b:>10} {'paired ' + a + '/' + b:>14}")
    for key, label in metrics:
        med = {n: statistics.median(x[key] for x in results[n]) for n in (a, b)}
        ratio = statistics.median(x[key] / y[key] for x, y in zip(results[a], results[b], strict=True))
        print(f"{label:34} {med[a]:10.3f} {med[b]:10.3f} {ratio:14.3f}")


if __name__ == "__main__":
    main()
