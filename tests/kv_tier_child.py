"""One worker process's life for tests/test_kv_tier.py: an Engine on a cache directory, its
worker backend (the worker's Batcher), one greedy request; prints what the worker reports.

``python tests/kv_tier_child.py MODEL CACHE_DIR PROMPT_LEN [--no-tier] [--hold]``: one JSON line
with the tokens, log-probabilities, the backend's prompt and cached prompt token counters (what a
worker reports to the broker), the tier's loaded and saved blocks and the prompt's block
addresses. ``--hold``: then wait for a line on stdin before exiting (a worker that stays up)."""

from __future__ import annotations

import json
import sys

from test_generate_batcher import drain

from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.worker.backend import EngineBackend
from ovpool.worker.generate.blocks import chain_hashes

# prompt_lookup off: its verify passes change log-probabilities in the last bits (not the tokens),
# as it decides per process, and these tests compare them exactly across processes.
SETTINGS = {"inference_precision": "f32", "kv_cache_precision": "f32", "prefix_cache": "on",
            "prefill_chunk": 64, "prompt_lookup": "off"}


def prompt(n: int) -> list[int]:
    return [10 + (7 * i + i // 9) % 90 for i in range(n)]


def report(backend: EngineBackend, completion, n: int) -> dict:
    link, scheduler = backend.runs.tier, backend.runs.scheduler
    return {"tokens": completion.token_ids,
            "logprobs": [[(t.token_id, t.logprob) for t in row.top] for row in completion.logprobs],
            "prompt_tokens": backend.prompt_tokens, "cached_prompt_tokens": backend.cached_prompt_tokens,
            "loaded": link.loaded if link else None, "saved": link.saved if link else None,
            "chain": [a.hex() for a in chain_hashes(scheduler.seed, prompt(n), scheduler.block_size)]}


def main(model: str, cache_dir: str, n: int, tier: bool, hold: bool) -> None:
    with Engine(model, cache_dir=cache_dir, settings={**SETTINGS, "kv_tier": tier}) as engine:
        backend = EngineBackend(engine, slots=2)
        assert backend.wait_batching()
        params = SamplingParams(max_tokens=16, ignore_eos=True, logprobs=2)
        done, _, failed = drain(backend, {0: [("r", prompt(n), params)]})
        assert not failed, failed
        print(json.dumps(report(backend, done["r"], n)), flush=True)
        if hold:
            sys.stdin.readline()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), "--no-tier" not in sys.argv, "--hold" in sys.argv)
