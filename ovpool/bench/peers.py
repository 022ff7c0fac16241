"""OpenVINO GenAI on the same GGUF, in the same run: LLMPipeline (single stream) and its
ContinuousBatchingPipeline at each concurrency level, with the prompts and lengths of the sweep.

GenAI reads the GGUF itself (its own graph, Q4_1 zero points rounded to u4) and uses its own
scheduler; prompts go in raw (no chat template), as ovpool's sweep sends them.
"""

from __future__ import annotations

import importlib.util
import time

from ovpool.bench.sweep import PROMPTS


def available() -> bool:
    return importlib.util.find_spec("openvino_genai") is not None


def _config(max_tokens: int):
    import openvino_genai as genai

    config = genai.GenerationConfig()
    config.max_new_tokens = max_tokens
    config.ignore_eos = True
    config.apply_chat_template = False
    return config


def single_stream(model_path: str, max_tokens: int, device: str = "CPU") -> dict:
    """LLMPipeline: time to first token and decode tokens/s (GenAI's own metrics), load seconds."""
    import openvino_genai as genai

    t0 = time.perf_counter()
    pipe = genai.LLMPipeline(model_path, device)
    load_s = time.perf_counter() - t0
    config = _config(max_tokens)
    pipe.generate(PROMPTS[0], _config(4))  # warm-up
    metrics = pipe.generate([PROMPTS[0]], config).perf_metrics
    ttft = metrics.get_ttft().mean / 1e3
    tpot = metrics.get_tpot().mean / 1e3
    return {"load_s": load_s, "ttft_s": ttft, "decode_tokens_per_s": 1.0 / tpot if tpot else None,
            "tokens_per_s": max_tokens / (metrics.get_generate_duration().mean / 1e3)}


class BatchedPipeline:
    """ContinuousBatchingPipeline: aggregate tokens/s with N prompts submitted together."""

    def __init__(self, model_path: str, device: str = "CPU"):
        import openvino_genai as genai

        scheduler = genai.SchedulerConfig()
        scheduler.cache_size = 1  # GiB of KV cache: plenty for 16 x (prompt + max_tokens)
        scheduler.enable_prefix_caching = False  # distinct prompts anyway; keep the comparison plain
        self.pipe = genai.ContinuousBatchingPipeline(model_path, scheduler, device)
        self.pipe.generate(list(PROMPTS[:1]), [_config(4)])  # warm-up

    def level(self, concurrency: int, max_tokens: int) -> dict:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(concurrency)]
        t0 = time.perf_counter()
        self.pipe.generate(prompts, [_config(max_tokens)] * concurrency)
        wall = time.perf_counter() - t0
        return {"concurrency": concurrency, "tokens": concurrency * max_tokens, "wall_s": wall,
                "tokens_per_s": concurrency * max_tokens / wall}
