"""Soak of the prefix cache: 2,000 distinct prompts through one worker's Batcher keep RSS flat.

    .venv/bin/python benchmarks/prefix_soak.py [--model smollm2] [--prompts 2000] [--kv-cache-mb 64]

Every prompt shares a ~60-token system prompt with 1 in 8 of the others and has ~40 tokens of its
own, so the pool keeps filling with cached blocks that can be reused, and evicting them (the pool
is small on purpose). The prompts go in 8 at a time, one token generated each. Printed every
``--every`` prompts: the process's RSS (VmRSS), the pool's cached blocks and the prompt tokens served
from the cache so far. The claim checked: RSS at the end is within a few MiB of RSS after the first
checkpoint (the cache lives inside ``kv_cache_mb`` and the route-key record is bounded).

``--kv-ram-mb N``: the KV tier on (a temporary cache directory, ``kv_tier_mb`` ``--kv-tier-mb``),
under a RAM tier of N MiB (ovpool.cache.kv_ram); every full prompt block goes through it. Printed
as well: the RAM tier's bytes and hits. The claim then: RSS at the end is within a few MiB of RSS
at the first checkpoint after the RAM tier reached its budget (it fills in the first few dozen
prompts), and RSS less RSS before the first prompt is at most the RAM tier's budget plus the disk
tier's bound on blocks not yet written (64 MiB) and what the pool and the runtime grow.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.worker.events import Failed, Finished
from ovpool.worker.generate.batcher import Batcher
from ovpool.worker.graph.cpu_class import CpuInfo

WORDS = ("river stone lantern harbor meadow copper violet engine orchard signal canyon ember "
         "glacier thimble compass falcon willow marble quartz saddle").split()


def rss_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024


def messages(i: int) -> list[dict]:
    """Prompt ``i``: a system prompt shared by the prompts of its group of 8, a question of its own."""
    group = i // 8
    system = " ".join(WORDS[(group * 7 + k * 3) % len(WORDS)] for k in range(50))
    own = " ".join(WORDS[(i * 11 + k * 5 + k // 4) % len(WORDS)] for k in range(30))
    return [{"role": "system", "content": f"Group {group}. {system}"},
            {"role": "user", "content": f"Question {i}: {own}"}]


def drain(batcher: Batcher, running: set[str]) -> None:
    """Step until at least one of ``running`` finishes."""
    left = len(running)
    while len(running) == left:
        for event in batcher.step():
            if isinstance(event, Finished | Failed):
                running.discard(event.request_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--kv-cache-mb", type=int, default=64)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--kv-ram-mb", type=int, default=0, help="the KV tier on, this much RAM above it")
    parser.add_argument("--kv-tier-mb", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ovpool-soak-") as tmp:
        soak(args, tmp if args.kv_ram_mb else "")


def tier_line(batcher: Batcher) -> str:
    if batcher.tier is None:
        return ""
    stats = batcher.tier.tier.stats
    return f", RAM tier {stats.get('ram_bytes', 0) / 2**20:.1f} MiB ({stats.get('ram_hits', 0)} hits)"


def soak(args: argparse.Namespace, cache_dir: str) -> None:
    settings = {"attention": "paged", "kv_cache_mb": args.kv_cache_mb, "prefix_cache": "on",
                "kv_tier": bool(cache_dir), "kv_ram_mb": args.kv_ram_mb, "kv_tier_mb": args.kv_tier_mb}
    with Engine(args.model, cache_dir=cache_dir, settings=settings) as engine:
        print(CpuInfo.read(engine.core).describe())
        batcher = engine.batcher(max_running=8)  # as a worker's
        print(f"before the first prompt: RSS {rss_mib():7.1f} MiB", flush=True)
        params = SamplingParams(max_tokens=1, ignore_eos=True)
        running: set[str] = set()
        for i in range(args.prompts):
            if len(running) == 8:
                drain(batcher, running)
            batcher.add(f"p{i}", messages(i), params)
            running.add(f"p{i}")
            if (i + 1) % args.every == 0:
                print(f"{i + 1:5d} prompts: RSS {rss_mib():7.1f} MiB, "
                      f"{batcher.cached_prompt_tokens}/{batcher.prompt_tokens} prompt tokens "
                      f"from the cache{tier_line(batcher)}", flush=True)
        while running:
            drain(batcher, running)
        print(f"end: RSS {rss_mib():7.1f} MiB")


if __name__ == "__main__":
    main()
