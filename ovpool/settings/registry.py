"""Every ovpool setting, in one table (docs/configuration.md is generated from it)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ovpool.bounds import MAX_SLOTS
from ovpool.settings.setting import API, BROKER, CLIENT, GRAPH, SERVE, WORKER, Setting


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/ovpool``, else ``~/.cache/ovpool`` (the XDG base directory convention)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "ovpool"


_SETTINGS = [
    # Where and how to run.
    Setting("device", str, "CPU", "OpenVINO device: CPU, GPU, GPU.1, ...", scopes=(WORKER,)),
    Setting("broker", str, "tcp://127.0.0.1:5555", "broker endpoint for clients and workers",
            scopes=(CLIENT, WORKER, API)),
    Setting("connect_timeout_s", float, 2.0, "client: how long a request waits for a connection to "
            "the broker (none yet, or a dropped one: a broker restarted within it gets the request "
            "again) before it fails with BrokerUnavailableError", minimum=0.01, scopes=(CLIENT,)),
    Setting("cache_dir", str, "", "compiled-model cache directory (default $XDG_CACHE_HOME/ovpool, else "
            "~/.cache/ovpool; empty: no cache, as --no-cache)",
            default_from_env=lambda env: str(default_cache_dir(env)), scopes=(WORKER,)),
    Setting("cache_only", bool, False, "import from the cache or fail; never compile or read weights",
            scopes=(WORKER,)),
    Setting("source_identity", str, "metadata", "how a GGUF is identified in the cache fingerprint",
            choices=("metadata", "content"), scopes=(WORKER,)),
    Setting("slots", int, 8, "concurrent sequences one worker serves", minimum=1, maximum=MAX_SLOTS,
            scopes=(WORKER,)),
    Setting("metrics_port", int, 0, "broker: Prometheus /metrics HTTP port (0: off)", minimum=0,
            maximum=65535, scopes=(BROKER,)),
    Setting("queue_limit", int, 256, "requests the broker queues per model before QueueFull", minimum=0,
            scopes=(BROKER,)),
    Setting("stream_stall_s", float, 30.0, "broker: a stream whose reader takes none of the tokens "
            "waiting for it for this long fails with ClientTooSlowError", minimum=0.01, scopes=(BROKER,)),
    Setting("progress_timeout_s", float, 60.0, "broker: a worker that sends no token of a request "
            "for this long (prefill included) loses it to another worker, and gets no new request "
            "until one of its others finishes", minimum=0.01, scopes=(BROKER,)),
    Setting("keep_alive_s", float, 300.0, "serve with several models: seconds a loaded model may sit "
            "idle before it unloads (Ollama's keep_alive; -1: never; 0: right after each request); a "
            "models file's keep_alive sets it per model", minimum=-1, scopes=(SERVE,)),
    Setting("max_loaded", int, 0, "serve with several models: at most this many loaded at once (each on "
            "every device it runs on); to load another, the least recently used idle one that is not "
            "pinned unloads first (0: no limit)", minimum=0, scopes=(SERVE,)),
    Setting("max_loaded_mb", float, 0.0, "serve with several models: at most this many MiB of loaded "
            "models per device, measured as their workers' PSS; over it, the least recently used idle "
            "one that is not pinned unloads (0: no limit)", minimum=0, scopes=(SERVE,)),
    Setting("spare_worker", bool, True, "serve with several models: keep one worker process started "
            "ahead, its libraries imported, so that a load skips the interpreter's start and the "
            "imports (a second or more); it holds ~40 MiB PSS while it waits", scopes=(SERVE,)),
    Setting("routing", str, "prefix", "broker: which free worker gets a request: prefix (the one "
            "most likely to hold its prompt's prefix in its cache, within a small load margin of the "
            "least busy) or least_loaded", choices=("prefix", "least_loaded"), scopes=(BROKER,)),
    Setting("cache_lock_timeout_s", float, 600.0, "how long a start waits for another process's "
            "cache lock (it logs the holder meanwhile) before compiling without exporting; "
            "cache-only mode fails then", minimum=0.0, scopes=(WORKER,)),
    Setting("max_prompt_tokens", int, 8192, "longest prompt a worker accepts", minimum=1, scopes=(WORKER,)),
    Setting("max_new_tokens", int, 4096, "largest max_tokens a request may ask for", minimum=1,
            scopes=(BROKER, WORKER, API)),
    Setting("shutdown_timeout_s", float, 30.0, "drain (SIGTERM to serve or the HTTP API, `ovpool "
            "drain`, a rolling restart): how long requests already accepted may run on before what "
            "is left fails with request.draining (vLLM's --shutdown-timeout); new requests are "
            "refused at once, retryable (HTTP 503 + Retry-After)", minimum=0.0, scopes=(API,)),
    Setting("max_connections", int, 1024, "HTTP API: the most client connections it holds open; one "
            "more is answered 503 + Retry-After and closed. Each holds a file descriptor: the soft "
            "limit (ulimit -n) is raised to fit, within the hard one", minimum=1, maximum=1 << 20,
            scopes=(API,)),
    Setting("curve_secret_key", str, "", "this peer's CURVE key pair file (.key_secret; empty: no CURVE)",
            scopes=(CLIENT, BROKER, WORKER)),
    Setting("curve_server_key", str, "", "the broker's CURVE public key file (clients and workers)",
            scopes=(CLIENT, WORKER)),
    Setting("curve_allowed_keys", str, "", "broker: directory of the public keys of its clients "
            "(they may submit; the HTTP API is a client)", scopes=(BROKER,)),
    Setting("curve_worker_keys", str, "", "broker: directory of the public keys of its workers (they "
            "may register and serve; CURVE needs both directories, one key's role is its directory)",
            scopes=(BROKER,)),
    Setting("prefill_chunk", int, 256, "prompt tokens prefilled per step while others decode", minimum=1,
            scopes=(WORKER,)),
    Setting("warm_up", str, "idle", "when the device's one-time kernel set-up runs (a short prefill "
            "and a decode step): idle (a worker, once it is registered and nothing waits; a bare "
            "Engine leaves it to its first requests), load (in Engine(...)) or off",
            choices=("idle", "load", "off"), scopes=(WORKER,)),
    Setting("batching", str, "paged", "how a worker runs its sequences: paged (one batched forward pass "
            "per step, continuous batching) or interleaved (no second, batching graph: requests run as "
            "the engine's own generations, batched on its graph where that is the paged one)",
            choices=("paged", "interleaved"), scopes=(WORKER,)),
    Setting("decode_graph", str, "auto", "a second compiled graph with static shapes for lone decode "
            "steps of the paged graph (padded as on it, so the same logits), made by a warm-up or after "
            "128 decode steps (a faster CPU decode step, docs/performance.md; a second layout of the "
            "weights): on, off, or auto (on the CPU for models of up to 512 MiB of weights, where that "
            "second layout costs less memory than "
            "its faster step is worth, and only if twice the weights fit in an eighth of physical memory; "
            "not on AMX at f32, where its faster step is not worth that memory)",
            choices=("auto", "on", "off"), scopes=(WORKER,)),
    Setting("decode_threads", int, 0, "threads the CPU decode graph runs on (0: every core, the "
            "plugin's default; fewer can decode as fast on cores shared with other jobs)", minimum=0,
            scopes=(WORKER,)),
    Setting("kv_cache_mb", int, 256, "MiB of paged KV-cache blocks per worker (batching=paged)", minimum=1,
            scopes=(WORKER,)),
    Setting("prefix_cache", str, "auto", "reuse the KV of a prompt's beginning that an earlier sequence "
            "computed (a shared system prompt, a chat's history), inside kv_cache_mb: on (only KV "
            "computed as the new request would compute it: answers unchanged), all (also a resent "
            "answer's, computed one token at a time: faster next turns, answers may differ), off; "
            "auto: on where measured exact (CPU at f32; bf16 on AVX-512 VNNI/BF16; not a u8 KV "
            "cache), else off (docs/prefix-caching.md)",
            choices=("auto", "on", "all", "off"), scopes=(WORKER,)),
    Setting("answer_copies", bool, True, "with prefix_cache on: a batched pass that only decodes also "
            "computes one full block of a running answer as a prompt pass would, cached for the chat's "
            "next turn, which then reuses its last answer too, with the same tokens; the same work, "
            "moved out of the next turn's time to first token (docs/prefix-caching.md)", scopes=(WORKER,)),
    Setting("answer_tails", bool, True, "with answer_copies: near an answer's end, a pass that gives no "
            "first token also computes the partial block the answer ends in as a prompt pass would, "
            "cached for the chat's next turn, which continues it, with the same tokens "
            "(docs/prefix-caching.md)", scopes=(WORKER,)),
    Setting("follow_up_ms", int, 20, "after a pass that ended an answer whose prompt began on two "
            "cached blocks or more (a chat's turn), hold the next pass up to this many milliseconds "
            "for the chat's next turn, which then joins it instead of waiting for all of it (0: off; "
            "the holds stay within 5% of the time in passes; docs/performance.md, Chat TTFT)",
            minimum=0, maximum=1000, scopes=(WORKER,)),
    Setting("prompt_lookup", str, "auto", "prompt-lookup speculative decoding: a decode step also "
            "verifies the tokens that followed the latest earlier occurrence of the text's last tokens "
            "(in its prompt or its answer so far), in the same pass; the tokens are those without it: "
            "on, off, or auto (at f32 only, per sequence as many as its measured acceptance pays for, "
            "while it decodes alone; docs/prompt-lookup.md)", choices=("auto", "on", "off"),
            scopes=(WORKER,)),
    Setting("prompt_lookup_tokens", int, 4, "prompt lookup: the most proposed tokens one decode step "
            "verifies", minimum=1, scopes=(WORKER,)),
    Setting("kv_tier", bool, True, "keep full prompt KV blocks on disk under the cache directory "
            "(<cache_dir>/v1/kv), shared by the host's workers of one graph and kept across restarts: "
            "a prompt whose beginning any of them computed loads it instead of computing it; only "
            "with a cache directory and where prefix_cache is on (docs/prefix-caching.md)",
            scopes=(WORKER,)),
    Setting("kv_events_endpoint", str, "", "publish the prefix cache's block events (stored, removed, "
            "all cleared) on a ZeroMQ PUB socket here, in vLLM's KV-events format, topic "
            "kv@<host>@<model>, for a gateway's prefix-aware endpoint picker: tcp://*:5557 binds, "
            "tcp://host:port connects; empty: off (docs/operations.md, Beyond one host)",
            scopes=(WORKER,)),
    Setting("kv_tier_mb", int, 1024, "MiB of disk the KV tier may take (every model's blocks "
            "together; least recently used blocks go first)", minimum=1, scopes=(WORKER,)),
    Setting("kv_ram_mb", int, 128, "MiB of host RAM each worker keeps KV blocks in above the disk "
            "tier (with kv_tier): the blocks its prompts computed or loaded, least recently used "
            "out, so a prefix evicted from kv_cache_mb comes back without a disk read; 0: none "
            "(docs/prefix-caching.md)", minimum=0, scopes=(WORKER,)),
    Setting("cache_max_mb", int, 20480, "MiB the whole cache directory may take (compiled models "
            "and the KV tier): past it, the least recently used entries and blocks go as new ones "
            "are written, never one a live worker maps (docs/cache.md)", minimum=1, scopes=(WORKER,)),
    # Graph-changing: these enter the cache fingerprint.
    Setting("inference_precision", str, "auto", "compute precision (auto: f32 on the CPU, the exact "
            "graph's numbers whatever the batch, where the plugin would pick bf16; the device's own "
            "elsewhere, f16 on GPUs; f16 is refused on the CPU; docs/performance.md, Quality)",
            choices=("auto", "f32", "bf16", "f16"), scopes=(GRAPH,)),
    Setting("kv_cache_precision", str, "auto", "KV-cache element type (auto on the CPU: f32 at f32 "
            "compute, the same tokens batched or alone; f16 at bf16, faster to decode than the "
            "plugin's u8 for twice the memory; the device's default elsewhere)",
            choices=("auto", "f32", "f16", "bf16", "u8"), scopes=(GRAPH,)),
    Setting("attention", str, "auto", "single-stream attention: paged (PagedAttention, the batching "
            "graph), sdpa (stateful ScaledDotProductAttention) or manual (stateful MatMul/Softmax); "
            "auto: paged, or sdpa where the paged graph cannot come from the cache",
            choices=("auto", "paged", "sdpa", "manual"), scopes=(GRAPH,)),
    Setting("stateful", bool, True, "keep the KV cache in OpenVINO state variables", scopes=(GRAPH,)),
    Setting("kquant_requant", str, "auto", "requantize K-quant weights (lossy) to 32-weight groups: "
            "q8_sym32 or q4_asym32 (Q4_K and Q6_K), q6_k_q8_sym32 (Q6_K alone, so its 16-weight groups "
            "no longer set every MatMul's int8 activation group to 16), or none; auto: q6_k_q8_sym32 "
            "where the CPU quantizes activations to int8 (VNNI/AMX at bf16), none elsewhere",
            choices=("auto", "none", "q4_asym32", "q8_sym32", "q6_k_q8_sym32"), scopes=(GRAPH,)),
    Setting("q4_storage", str, "auto", "how 4-bit codes (Q4_0, Q4_1, Q4_K) sit in the graph: i4 (packed) "
            "or i8 (one per byte, same values; the CPU plugin's first-inference set-up is faster, "
            "weights take twice the memory and decode reads twice the bytes); auto: i4",
            choices=("auto", "i4", "i8"), scopes=(GRAPH,)),
    Setting("zero_points", str, "auto", "how Q4_1/Q4_K's per-block minimum enters the graph: float (an "
            "exact float zero point), integer (a rounded u4 zero point plus the exact remainder as a "
            "small correction term, so the CPU plugin's int8 kernels take the MatMul), offset (codes "
            "with no zero point plus the block offsets as that term: less CPU per decode step at "
            "f32 on large Q4_K models, logits a little further from a float64 pass), or rounded "
            "(the rounded zero point alone, as OpenVINO GenAI reads Q4_1: faster, not exact: it "
            "agrees less often with the f32 reference's top token, docs/performance.md); auto: "
            "integer where the CPU quantizes activations to int8 (VNNI/AMX at bf16), float elsewhere",
            choices=("auto", "offset", "float", "integer", "rounded"), scopes=(GRAPH,)),
    Setting("activations", str, "auto", "what the CPU plugin multiplies compressed weights with: "
            "float (the activations at the compute precision: at f32 the exact graph's numbers) or "
            "int8 (the plugin's dynamic quantization, per group of 32 activations, 16 with Q6_K "
            "weights, on VNNI/AMX int8 kernels; Q4_1/Q4_K's minimum then goes in as an integer zero "
            "point plus its exact remainder; no effect without VNNI); auto: int8 at bf16 where the "
            "CPU has VNNI, float at f32 (docs/performance.md, Quality)",
            choices=("auto", "float", "int8"), scopes=(GRAPH,)),
]

REGISTRY: dict[str, Setting] = {s.name: s for s in _SETTINGS}
