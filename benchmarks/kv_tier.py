"""Time to first token of a long prefix after a restart, with the disk KV tier and without.

Each run is a fresh worker-like process on one cache directory (the compiled-model cache already
populated, so both sides import the same graphs): an Engine with ``prefix_cache=on``, its Batcher
set up (``warm_up``), then one greedy request whose prompt is a ``--prefix``-token prefix and a
short suffix of its own. TTFT is timed inside the process from the request's admission to its
first token, so start-up is not in it. Runs alternate (without, with; then with, without; ...), and
the figures are medians over ``--repeats`` pairs. The tier's read and write bandwidth come from its
own counters (read: the blocks a run loaded, page cache warm unless ``--evict``, which drops the
block files' pages first with POSIX_FADV_DONTNEED; write: the blocks the populating run wrote, tmp +
fsync + rename each). The break-even prefix: loading a block costs ``load_s_per_block``, computing
its tokens ``compute_s_per_token × block_size`` in a run without the tier; the tier pays from the
first full block when the first is smaller (a prefix shorter than a block has nothing to load).

    .venv/bin/python benchmarks/kv_tier.py [--model smollm2] [--prefix 2000] [--repeats 3]
        [--precision auto] [--evict] [--second-worker] [--hits [--ram-mb 256]] [--json]

``--second-worker``: the worker that wrote the prefix's blocks stays up (idle) while the pairs run,
so "with" is a second worker beside it taking its prefix, not a restart.

``--hits``: RAM tier hit against disk tier hit, in one process each (alternating): the prefix, then
another prefix as long that evicts the first from a pool sized for one (``kv_cache_mb`` set from
the block size), then the first prefix again with a suffix of its own, whose TTFT is timed; its
blocks come from the RAM tier (``kv_ram_mb`` = ``--ram-mb``, room for both prefixes) or, with
``kv_ram_mb=0``, from the disk tier (page cache warm). Per block: the tier's read and the copy
into the pool (``TierLink.load_s``).

Goal (issue 29): TTFT with the tier ≤ 0.15× without. Each pair also checks that both runs chose the
same greedy tokens (``same_tokens``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUFFIX = 24  # tokens after the prefix, different in every run


def prompt(prefix: int, salt: int, step: int = 7919) -> list[int]:
    """``prefix`` fixed token ids (``step`` picks which), then SUFFIX of run ``salt``'s own
    (ordinary ids of SmolLM2's)."""
    shared = [100 + (i * step) % 20000 for i in range(prefix)]
    return shared + [200 + (salt * 31 + i) % 5000 for i in range(SUFFIX)]


def first_token(batcher, tokens: list[int]) -> tuple[float, list[int]]:
    """Run one greedy request to its end: (seconds from its admission to its first token, tokens)."""
    from ovpool.sampling_params import SamplingParams
    from ovpool.worker.events import Token

    start = time.perf_counter()
    batcher.add(f"r{start}", tokens, SamplingParams(max_tokens=8, ignore_eos=True))
    ttft, out = None, []
    while batcher.active:
        for event in batcher.step():
            if isinstance(event, Token):
                ttft = ttft or time.perf_counter() - start
                out.append(event.delta.token_id)
    return ttft, out


def child(args: argparse.Namespace) -> dict:
    from ovpool import Engine

    if args.child in ("ram", "disk"):
        return hit_child(args)
    settings = {"prefix_cache": "on", "kv_tier": args.child == "on", "inference_precision": args.precision,
                "max_prompt_tokens": args.prefix + SUFFIX + 8}
    with Engine(args.model, cache_dir=args.cache_dir, settings=settings) as engine:
        batcher = engine.batcher(max_running=2)
        batcher.warm_up()
        ttft, tokens = first_token(batcher, prompt(args.prefix, args.salt))
        tier = batcher.tier.tier if batcher.tier else None
        if tier is not None:
            tier.flush(120)
        result = {"ttft_s": ttft, "tokens": tokens, "cached": batcher.cached_prompt_tokens,
                "block_size": batcher.runner.block_size, "block_bytes": batcher.runner.block_bytes,
                "stats": dict(tier.stats) if tier else None}
        if args.hold:  # a worker that stays up beside the next ones
            print(json.dumps(result), flush=True)
            sys.stdin.readline()
        return result


def hit_child(args: argparse.Namespace) -> dict:
    """``--hits``' process: the prefix, another that evicts it from the pool, the prefix again."""
    from ovpool import Engine

    settings = {"prefix_cache": "on", "kv_tier": True, "inference_precision": args.precision,
                "max_prompt_tokens": args.prefix + SUFFIX + 8, "kv_cache_mb": args.pool_mb,
                "kv_ram_mb": args.ram_mb if args.child == "ram" else 0}
    with Engine(args.model, cache_dir=args.cache_dir, settings=settings) as engine:
        batcher = engine.batcher(max_running=2)
        batcher.warm_up()
        first_token(batcher, prompt(args.prefix, 0))
        first_token(batcher, prompt(args.prefix, 0, step=7907))  # evicts the first from the pool
        batcher.tier.tier.flush(120)
        link = batcher.tier
        loaded, load_s, cached = link.loaded, link.load_s, batcher.cached_prompt_tokens
        ttft, tokens = first_token(batcher, prompt(args.prefix, args.salt))
        return {"ttft_s": ttft, "tokens": tokens, "cached": batcher.cached_prompt_tokens - cached,
                "loaded": link.loaded - loaded, "load_s": link.load_s - load_s,
                "block_bytes": batcher.runner.block_bytes, "pool_blocks": batcher.runner.num_blocks,
                "stats": dict(link.tier.stats)}


def command(args: argparse.Namespace, cache_dir: Path, mode: str, salt: int) -> list[str]:
    return [sys.executable, __file__, "--child", mode, "--cache-dir", str(cache_dir), "--model", args.model,
            "--prefix", str(args.prefix), "--salt", str(salt), "--precision", args.precision,
            "--pool-mb", str(args.pool_mb), "--ram-mb", str(args.ram_mb)]


def run(args: argparse.Namespace, cache_dir: Path, mode: str, salt: int) -> dict:
    out = subprocess.run(command(args, cache_dir, mode, salt), capture_output=True, text=True, check=False)
    if out.returncode:
        sys.exit(f"child {mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def evict(kv_dir: Path) -> None:
    for path in kv_dir.glob("*/*.kv"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def rate(stats: dict, kind: str) -> float:
    key = "read" if kind == "read" else "written"
    seconds = stats[f"{kind}_s"]
    return stats[f"{key}_bytes"] / seconds / 2**20 if seconds else float("nan")


def measure_hits(args: argparse.Namespace) -> dict:
    """``--hits``: RAM tier hits against disk tier hits, alternating processes."""
    with tempfile.TemporaryDirectory(prefix="ovpool-kv-tier-") as tmp:
        cache_dir = Path(tmp)
        populate = run(args, cache_dir, "on", salt=0)
        blocks = -(-(args.prefix + SUFFIX + 8) // populate["block_size"]) + 4  # one prompt and a few
        args.pool_mb = -(-blocks * populate["block_bytes"] // 2**20)
        rounds = []
        for r in range(args.repeats):
            order = ("ram", "disk") if r % 2 == 0 else ("disk", "ram")
            rounds.append({mode: run(args, cache_dir, mode, salt=r + 1) for mode in order})
    out = {"prefix_tokens": args.prefix, "repeats": args.repeats, "pool_mb": args.pool_mb,
           "ram_mb": args.ram_mb, "block_bytes": populate["block_bytes"],
           "same_tokens": all(p["ram"]["tokens"] == p["disk"]["tokens"] for p in rounds)}
    for mode in ("ram", "disk"):
        got = [p[mode] for p in rounds]
        per_block = statistics.median(g["load_s"] / g["loaded"] for g in got if g["loaded"])
        out |= {f"{mode}_ttft_s": statistics.median(g["ttft_s"] for g in got),
                f"{mode}_loaded_blocks": statistics.median(g["loaded"] for g in got),
                f"{mode}_cached_tokens": statistics.median(g["cached"] for g in got),
                f"{mode}_load_ms_per_block": per_block * 1e3,
                f"{mode}_load_mib_s": populate["block_bytes"] / per_block / 2**20}
    out["ttft_ram_over_disk"] = out["ram_ttft_s"] / out["disk_ttft_s"]
    return out


def measure(args: argparse.Namespace) -> dict:
    if args.hits:
        return measure_hits(args)
    with tempfile.TemporaryDirectory(prefix="ovpool-kv-tier-") as tmp, contextlib.ExitStack() as stack:
        cache_dir = Path(tmp)
        if args.second_worker:  # compiles, exports, writes the prefix's blocks, stays up
            first = subprocess.Popen([*command(args, cache_dir, "on", 0), "--hold"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            stack.callback(first.communicate, "\n")
            populate = json.loads(first.stdout.readline())
        else:
            populate = run(args, cache_dir, "on", salt=0)  # the same, then exits: the pairs restart
        pairs = []
        for r in range(args.repeats):
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            got = {}
            for mode in order:
                if mode == "on" and args.evict:
                    evict(cache_dir / "v1" / "kv")
                got[mode] = run(args, cache_dir, mode, salt=r + 1)
            pairs.append(got)
    off = statistics.median(p["off"]["ttft_s"] for p in pairs)
    on = statistics.median(p["on"]["ttft_s"] for p in pairs)
    loads = [p["on"]["stats"] for p in pairs]
    block = populate["block_size"]
    load_per_block = statistics.median(s["read_s"] / s["hits"] for s in loads if s["hits"])
    compute_per_token = off / (args.prefix + SUFFIX)
    return {
        "prefix_tokens": args.prefix, "repeats": args.repeats, "precision": args.precision,
        "evict": args.evict, "second_worker": args.second_worker,
        "ttft_without_s": off, "ttft_with_s": on, "ratio": on / off,
        "cached_prompt_tokens": statistics.median(p["on"]["cached"] for p in pairs),
        "same_tokens": all(p["on"]["tokens"] == p["off"]["tokens"] for p in pairs),
        "block_size": block, "block_bytes": populate["block_bytes"],
        "read_mib_s": statistics.median(rate(s, "read") for s in loads),
        "write_mib_s": rate(populate["stats"], "write"),
        "load_s_per_block": load_per_block, "compute_s_per_token": compute_per_token,
        "break_even_tokens": block if load_per_block < compute_per_token * block else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prefix", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precision", default="auto", help="inference_precision of both sides")
    parser.add_argument("--evict", action="store_true", help="drop the block files' pages before each load")
    parser.add_argument("--second-worker", action="store_true",
                        help="the worker that wrote the prefix stays up beside the measured ones")
    parser.add_argument("--hits", action="store_true", help="RAM tier hits against disk tier hits")
    parser.add_argument("--ram-mb", type=int, default=256, help="kv_ram_mb of --hits' RAM side")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=("on", "off", "ram", "disk"), help=argparse.SUPPRESS)
    parser.add_argument("--pool-mb", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    parser.add_argument("--salt", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    result = measure(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        print(f"{key:>22}: {value:.4g}" if isinstance(value, float) else f"{key:>22}: {value}")


if __name__ == "__main__":
    main()
