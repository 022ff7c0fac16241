"""Tokenizer speed on a real GGUF: build time from metadata (it is on the serving load path),
encode and streaming-decode throughput, and the per-token cost of sampling over its vocabulary.

    .venv/bin/python benchmarks/tokenizer_speed.py [--model smollm2] [--repeats 7]

Encode runs cold (a fresh tokenizer, empty word cache) and warm (the same text again).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from ovpool.sampling_params import SamplingParams
from ovpool.worker.generate.logprobs import Logprobs
from ovpool.worker.generate.sampler import Sampler
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.text.tokenizer import Tokenizer


def timed(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    text = "\n".join(p.read_text() for p in sorted(Path(__file__).parent.parent.glob("ovpool/**/*.py")))
    metadata = GGUFModel.open(args.model).metadata
    build_s, tok = timed(lambda: Tokenizer.from_metadata(metadata), args.repeats)
    cold_s, ids = timed(lambda: Tokenizer.from_metadata(metadata).encode(text), args.repeats)
    cold_s -= build_s
    warm_s, _ = timed(lambda: tok.encode(text), args.repeats)

    def stream():
        decoder = tok.stream_decoder()
        return "".join(decoder.push(i) for i in ids) + decoder.flush()

    decode_s, _ = timed(stream, args.repeats)
    logits = np.random.default_rng(0).standard_normal(tok.vocab_size).astype(np.float32)
    rows = [("tokenizer build from metadata", f"{build_s * 1e3:.1f} ms"),
            (f"encode cold ({len(text) / 1e3:.0f}k chars -> {len(ids)} tokens)",
             f"{len(ids) / cold_s / 1e3:.0f}k tokens/s"),
            ("encode warm (word cache filled)", f"{len(ids) / warm_s / 1e3:.0f}k tokens/s"),
            ("stream decode, one token at a time", f"{len(ids) / decode_s / 1e3:.0f}k tokens/s")]
    for label, params in [("greedy", SamplingParams()),
                          ("temperature 0.8", SamplingParams(temperature=0.8, seed=0)),
                          ("temperature 0.8, top_p 0.9", SamplingParams(temperature=0.8, top_p=0.9, seed=0)),
                          ("temperature 0.8, top_k 40", SamplingParams(temperature=0.8, top_k=40, seed=0)),
                          ("temperature 0.8, min_p 0.05",
                           SamplingParams(temperature=0.8, min_p=0.05, seed=0)),
                          ("top_p 0.9, penalties", SamplingParams(
                              temperature=0.8, top_p=0.9, repetition_penalty=1.1, presence_penalty=0.5,
                              seed=0)),
                          ("greedy, logprobs 5", SamplingParams(logprobs=5))]:
        sampler, gen_logprobs = Sampler(params, ids[:200]), Logprobs(tok, params.logprobs or 0)

        def one(s=sampler, lp=gen_logprobs if params.logprobs is not None else None):
            token = s.choose(logits)
            return lp.of(logits, token) if lp else token

        per, _ = timed(lambda f=one: [f() for _ in range(100)], args.repeats)
        rows.append((f"sample one token: {label}", f"{per / 100 * 1e3:.3f} ms"))
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


if __name__ == "__main__":
    main()
