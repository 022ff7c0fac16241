"""Time to first token of a chat's second turn with the prefix cache on, all and off, one worker's
Batcher (continuous batching on the paged graph), the same process and model.

    .venv/bin/python benchmarks/prefix_ttft.py [--model smollm2] [--system-tokens 1000] [--rounds 5]

Each round, for each mode in turn (the order rotates per round, so background load on a shared
machine hits every mode alike): a fresh Batcher (an empty pool); turn 1 is a ~``--system-tokens``
system prompt (a fresh text per round) and a question, answered with ``--new-tokens`` tokens;
turn 2 resends it all with the answer and a new question, and its TTFT (admission to first token)
is what is reported: the median per mode, the median of the per-round ratios to ``off`` (column
``paired``) and the prompt tokens each served from the cache.
"""

from __future__ import annotations

import argparse
import statistics

from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.worker.events import Finished
from ovpool.worker.generate.batch import PagedRunner
from ovpool.worker.generate.batcher import Batcher
from ovpool.worker.graph.cpu_class import CpuInfo

MODES = ("on", "all", "off")
WORDS = ("river stone lantern harbor meadow copper violet engine orchard signal canyon ember "
         "glacier thimble compass falcon willow marble quartz saddle").split()


def system_text(round_: int, tokens: int) -> str:
    """~``tokens`` tokens of text no other round shares (SmolLM2: ~1.2 tokens per word here)."""
    words = [WORDS[(i * 7 + round_ * 3 + i // 20) % len(WORDS)] for i in range(int(tokens / 1.2))]
    return f"Session {round_}. " + " ".join(words)


def run(batcher: Batcher, rid: str, messages, new_tokens: int):
    batcher.add(rid, messages, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
    while True:
        for event in batcher.step():
            if isinstance(event, Finished):
                return event.completion


def one_round(engine: Engine, mode: str, round_: int, args) -> tuple[float, int, int]:
    runner = PagedRunner(engine.compiled, kv_cache_mb=256, decode=engine.load_result.decode)
    batcher = engine.batcher(runner, max_running=4, prefill_chunk=engine.settings.prefill_chunk,
                             prefix_cache=mode)
    messages = [{"role": "system", "content": system_text(round_, args.system_tokens)},
                {"role": "user", "content": "Summarize the list above in one sentence."}]
    first = run(batcher, "turn1", messages, args.new_tokens)
    messages += [{"role": "assistant", "content": first.text},
                 {"role": "user", "content": "Now name its three most frequent words."}]
    before = batcher.prompt_tokens, batcher.cached_prompt_tokens
    second = run(batcher, "turn2", messages, 4)
    return (second.timings["ttft_s"], batcher.prompt_tokens - before[0],
            batcher.cached_prompt_tokens - before[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with Engine(args.model, settings={"attention": "paged", "warm_up": "load"}) as engine:
        print(CpuInfo.read(engine.core).describe())
        print("graph:", engine.graph_settings, "auto prefix_cache:", engine.prefix_cache)
        one_round(engine, "off", -1, args)  # kernels for every pass size, once
        ttft = {m: [] for m in MODES}
        for r in range(args.rounds):
            for mode in MODES[r % 3:] + MODES[:r % 3]:
                seconds, prompt, cached = one_round(engine, mode, r, args)
                ttft[mode].append(seconds)
                print(f"round {r} {mode:>3}: turn-2 TTFT {seconds * 1000:7.1f} ms, "
                      f"{cached}/{prompt} prompt tokens from the cache", flush=True)
        for mode in MODES:
            paired = statistics.median(a / b for a, b in zip(ttft[mode], ttft["off"], strict=True))
            print(f"{mode:>3}: median TTFT {statistics.median(ttft[mode]) * 1000:7.1f} ms, "
                  f"paired ratio to off {paired:.3f}")


if __name__ == "__main__":
    main()
