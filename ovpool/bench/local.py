"""In-process measurements of one Engine: single-stream speed, and how often batched greedy output
agrees with each request run alone at the configured (default: the device's fastest) precision."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ovpool.bench.sweep import PROMPTS
from ovpool.completion import Completion
from ovpool.sampling_params import SamplingParams
from ovpool.worker.backend import EngineBackend, Failed, Finished
from ovpool.worker.engine import Engine


def single_stream(engine: Engine, max_tokens: int) -> dict:
    """Time to first token and decode tokens/s of one request on the engine's own graph."""
    engine.warm_up()  # the steady state: kernels set up, the decode graph (if any) compiled
    engine.complete(PROMPTS[0], max_tokens=4)
    done = engine.complete(PROMPTS[0], max_tokens=max_tokens, ignore_eos=True)
    t = done.timings
    return {"ttft_s": t["ttft_s"], "decode_tokens_per_s": t.get("decode_tps"),
            "tokens_per_s": len(done.token_ids) / t["total_s"], "load": engine.load_report}


def run_all(backend: Any, requests: Mapping[str, tuple[Any, SamplingParams]]) -> dict[str, Completion]:
    """Add every request, step the backend until idle, and return each Completion."""
    for rid, (prompt, params) in requests.items():
        backend.add(rid, prompt, params)
    done: dict[str, Completion] = {}
    while backend.active:
        for ev in backend.step():
            if isinstance(ev, Finished):
                done[ev.request_id] = ev.completion
            elif isinstance(ev, Failed):
                raise ev.error
    return done


def agreement(engine: Engine, concurrency: int, max_tokens: int) -> dict:
    """Greedy: requests batched together vs. each alone, token by token. Alone is measured two
    ways: through the same batching backend one request at a time (isolates batching), and on the
    engine's own graph (Engine.complete; a different KV-cache layout and quantization)."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    requests = {str(i): (PROMPTS[i % len(PROMPTS)], params) for i in range(concurrency)}
    backend = EngineBackend(engine, slots=concurrency)
    backend.wait_batching()
    batched = run_all(backend, requests)
    one_by_one = {rid: run_all(backend, {rid: req})[rid] for rid, req in requests.items()}
    engine_alone = {rid: engine.complete(prompt, **params.to_dict()) for rid, (prompt, _) in requests.items()}
    return {"requests": concurrency, "precision": engine.graph_settings["inference_precision"],
            "kv_cache_precision": engine.graph_settings["kv_cache_precision"],
            "vs_alone_batching_path": _agreement(batched, one_by_one, max_tokens),
            "vs_engine": _agreement(batched, engine_alone, max_tokens)}


def _agreement(a: Mapping[str, Completion], b: Mapping[str, Completion], max_tokens: int) -> dict:
    prefixes = [_common_prefix(a[r].token_ids, b[r].token_ids) / max_tokens for r in a]
    return {"identical": sum(p == 1.0 for p in prefixes), "mean_common_prefix": sum(prefixes) / len(prefixes)}


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
