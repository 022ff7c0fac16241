"""The gauges the Gateway API Inference Extension's endpoint picker reads, under the names of its
model-server protocol (docs/proposals/003-model-server-protocol, gateway-api-inference-extension
v1.6.0), which are vLLM's: each InferencePool endpoint (an `ovpool serve` pod's HTTP API) exports
them at ``/metrics`` beside its own ``ovpool_http_*`` metrics, read from the broker's STATUS at
each scrape. Per model (label ``model_name``, as vLLM's):

- ``vllm:num_requests_waiting``: requests in the broker's queue (TotalQueuedRequests);
- ``vllm:num_requests_running``: requests running on its workers (TotalRunningRequests);
- ``vllm:kv_cache_usage_perc``: KVCacheUtilization as a fraction 0..1, as vLLM reports it. The
  workers do not report their KV blocks to the broker, so this is the share of their sequence
  slots in use: each running sequence holds KV blocks, an idle pool holds none;
- ``vllm:cache_config_info{block_size}`` (optional BlockSize): 1, with the paged KV cache's block
  of 32 token positions as a label.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest

# The paged KV cache's block (worker/generate/blocks.py, the CPU plugin's PagedAttention block).
KV_BLOCK_SIZE = 32
NAMES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
         "vllm:cache_config_info")


def render(status: dict | None) -> bytes:
    """The gauges for one broker STATUS (None: no answer, so nothing is exported: a scrape then
    shows the endpoint has no data rather than an idle pool)."""
    if status is None:
        return b""
    registry = CollectorRegistry()
    waiting, running, kv, config = (
        Gauge(name, help_text, labels, registry=registry) for name, help_text, labels in (
            (NAMES[0], "Requests waiting in the broker's queue", ["model_name"]),
            (NAMES[1], "Requests running on the workers", ["model_name"]),
            (NAMES[2], "KV-cache usage, 0..1 (the share of sequence slots in use)", ["model_name"]),
            (NAMES[3], "KV-cache configuration", ["block_size"])))
    for model, (queued, active, slots) in _per_model(status).items():
        waiting.labels(model).set(queued)
        running.labels(model).set(active)
        kv.labels(model).set(active / slots if slots else 0.0)
    config.labels(str(KV_BLOCK_SIZE)).set(1)
    return generate_latest(registry)


def _per_model(status: dict) -> dict[str, tuple[int, int, int]]:
    """model -> (queued, running, slots), each worker counted under the model it serves first."""
    found: dict[str, list[int]] = {}
    for worker in status.get("workers") or []:
        models = worker.get("models") or [""]
        entry = found.setdefault(str(models[0]), [0, 0, 0])
        entry[1] += int(worker.get("active") or 0)
        entry[2] += int(worker.get("slots") or 0)
    for model, depth in (status.get("queues") or {}).items():
        if isinstance(depth, int) and (depth or model in found):
            found.setdefault(str(model), [0, 0, 0])[0] += depth
    return {m: (q, a, s) for m, (q, a, s) in sorted(found.items())}
