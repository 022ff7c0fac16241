"""Prometheus metrics of the broker, defined once; the broker loop calls ``BrokerMetrics`` methods.

Each ``BrokerMetrics`` owns its registry, so several brokers (tests) in one process never clash.
Every name starts with ``ovpool_``. Tokens per second is exported two ways: the counter
``ovpool_tokens_generated_total`` (``rate()`` of it is the pool's throughput) and a per-request
histogram of decode speed.

Per-worker cache outcome: a worker reports how it loaded its model in READY (``hit``: imported a
cached blob; ``wrote``: compiled and exported; ``compiled``: compiled without a cache); each worker
counts once (it sends READY again whenever the broker asks it to register again).

Every label value comes from a bounded set, whatever peers send: a model label only for a model a
worker registered (a request naming any other counts as ``unknown``), at most ``MAX_WORKER_LABELS``
worker ids and ``MAX_DEVICE_LABELS`` devices (the rest count as ``other``), and per-worker prefix
gauges only for the workers registered now.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sized

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ovpool import errors
from ovpool.bounds import MAX_NAME_CHARS
from ovpool.broker.bounds import MAX_NAMES
from ovpool.protocol import Error, Final, Partial, Ready, Request, Submit

# Seconds; a streamed first token on CPU lands between a few ms and several seconds.
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_TPS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
_LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
WORKER_STATES = ("starting", "ready", "busy", "backoff", "failing")
# Supervised states of workers not registered with the broker (a registered one is ready or busy).
_UNREGISTERED = ("starting", "backoff", "failing")
RESIDENCY_STATES = ("unloaded", "loading", "loaded", "unloading", "failed")  # broker/residency.py
# READY's load outcome → which cache counters it increments.
_CACHE_EVENTS = {"hit": ("hits",), "wrote": ("misses", "writes"), "compiled": ("misses",),
                 "miss": ("misses",)}
MAX_MODEL_LABELS = 256
MAX_WORKER_LABELS = 1024
MAX_DEVICE_LABELS = 64
UNKNOWN_MODEL = "unknown"  # the model label of a request for a model no worker registered
OTHER = "other"


class LabelSet:
    """At most ``limit`` distinct values of one label, the first ones seen; ``label`` maps any
    other value to ``other``."""

    def __init__(self, limit: int, other: str = OTHER):
        self.limit, self.other = limit, other
        self._seen: set[str] = set()

    def __contains__(self, value: object) -> bool:
        return type(value) is str and value in self._seen

    def add(self, value: object) -> None:
        if (type(value) is str and len(value) <= MAX_NAME_CHARS and value not in self._seen
                and len(self._seen) < self.limit):
            self._seen.add(value)

    def label(self, value: object) -> str:
        self.add(value)
        return value if value in self._seen else self.other


class BrokerMetrics:
    """The broker's metrics; methods are cheap enough to call on every message."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("ovpool_requests", "Finished requests by model and outcome "
                                "(ok, or the error code)", ["model", "outcome"], registry=r)
        self.queue_depth = Gauge("ovpool_queue_depth", "Requests waiting for a worker",
                                 ["model"], registry=r)
        self.ttft = Histogram("ovpool_time_to_first_token_seconds", "Submit to first token",
                              ["model"], buckets=_TTFT_BUCKETS, registry=r)
        self.latency = Histogram("ovpool_request_latency_seconds", "Submit to final answer",
                                 ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("ovpool_tokens_generated", "Completion tokens sent to clients",
                              ["model"], registry=r)
        self.tokens_per_s = Histogram("ovpool_request_tokens_per_second", "Decode speed per request "
                                      "(completion tokens after the first / time since it)",
                                      ["model"], buckets=_TPS_BUCKETS, registry=r)
        self.workers = Gauge("ovpool_workers", "Workers by state (supervised ones included)",
                             ["state"], registry=r)
        self.cache = Counter("ovpool_worker_cache", "Worker model loads by cache event "
                             "(hits, misses, writes)", ["worker", "device", "event"], registry=r)
        self.load_seconds = Histogram("ovpool_worker_load_seconds", "Worker model load time by outcome",
                                      ["device", "outcome"], buckets=_LOAD_BUCKETS, registry=r)
        self.last_load_seconds = Gauge("ovpool_worker_last_load_seconds", "Latest load time per worker",
                                       ["worker", "device"], registry=r)
        # The worker's own running totals (it reports them in each heartbeat), hence gauges.
        self.prompt_tokens = Gauge("ovpool_worker_prompt_tokens", "Prompt tokens a worker was asked "
                                   "for since it started", ["worker"], registry=r)
        self.cached_prompt_tokens = Gauge("ovpool_worker_cached_prompt_tokens", "Of those, the ones "
                                          "its prefix cache served", ["worker"], registry=r)
        self.prefix_routed = Gauge("ovpool_prefix_routed", "Dispatches of requests with route keys, "
                                   "by whether the chosen worker held part of the prompt (hit, miss)",
                                   ["outcome"], registry=r)
        # Models `ovpool serve` loads on demand, from its reports (broker/residency.py).
        self.model_state = Gauge("ovpool_model_state", "1 for the state each model loaded on demand is "
                                 "in (unloaded, loading, loaded, unloading, failed)", ["model", "state"],
                                 registry=r)
        self.model_loads = Gauge("ovpool_model_loads", "Loads of each model loaded on demand since "
                                 "its serve started", ["model"], registry=r)
        self.model_unloads = Gauge("ovpool_model_unloads", "Unloads of each model loaded on demand "
                                   "(keep-alive, least recently used)", ["model"], registry=r)
        self.model_waiting = Gauge("ovpool_model_load_wait_seconds", "How long requests for a model "
                                   "have waited for its load now (0: none waits)", ["model"], registry=r)
        self._residency_models = LabelSet(MAX_MODEL_LABELS, UNKNOWN_MODEL)
        self._prefix_workers: set[str] = set()
        self._workers, self._devices = LabelSet(MAX_WORKER_LABELS), LabelSet(MAX_DEVICE_LABELS)

    def set_queue_depth(self, model: str, depth: int) -> None:
        self.queue_depth.labels(model).set(depth)

    def add_model(self, model: str) -> None:
        """Export ``model``'s queue depth (0) from its first worker on: an empty queue is a value,
        not a missing series, and the broker creates a queue only when a request names the model."""
        self.queue_depth.labels(model)

    def observe_final(self, model: str, outcome: str, *, latency_s: float,
                      ttft_s: float | None = None, completion_tokens: int = 0) -> None:
        """One finished request: ``outcome`` is ``ok`` or the error's wire code."""
        self.requests.labels(model, outcome).inc()
        self.latency.labels(model).observe(latency_s)
        if ttft_s is not None:
            self.ttft.labels(model).observe(ttft_s)
        if completion_tokens:
            self.tokens.labels(model).inc(completion_tokens)
        if ttft_s is not None and completion_tokens > 1 and latency_s > ttft_s:
            self.tokens_per_s.labels(model).observe((completion_tokens - 1) / (latency_s - ttft_s))

    def set_workers(self, counts: Mapping[str, int]) -> None:
        """Workers by state; a state missing from ``counts`` is 0."""
        for state in sorted(set(WORKER_STATES) | set(counts)):
            self.workers.labels(state).set(counts.get(state, 0))

    def set_models(self, entries: Iterable[Mapping]) -> None:
        """serve's reports of the models it loads on demand (entries with ``model``, ``residency``)."""
        for entry in entries:
            self._residency_models.add(entry["model"])
            model = self._residency_models.label(entry["model"])
            for state in RESIDENCY_STATES:
                self.model_state.labels(model, state).set(int(entry["residency"] == state))
            for gauge, key in ((self.model_loads, "loads"), (self.model_unloads, "unloads"),
                               (self.model_waiting, "waiting_s")):
                if type(entry.get(key)) in (int, float):
                    gauge.labels(model).set(entry[key])

    def set_prefix(self, workers: Iterable[tuple[str, int, int]], hits: int, misses: int) -> None:
        """Per worker registered now (id, prompt tokens, cached prompt tokens), the others' series
        removed; the router's hits and misses."""
        now = set()
        for worker, prompt, cached in workers:
            now.add(worker)
            self.prompt_tokens.labels(worker).set(prompt)
            self.cached_prompt_tokens.labels(worker).set(cached)
        for gone in self._prefix_workers - now:
            self.prompt_tokens.remove(gone)
            self.cached_prompt_tokens.remove(gone)
        self._prefix_workers = now
        self.prefix_routed.labels("hit").set(hits)
        self.prefix_routed.labels("miss").set(misses)

    def observe_worker_load(self, worker: str, device: str, outcome: str, seconds: float) -> None:
        """A worker's READY: how it got its compiled model and how long that took."""
        worker, device = self._workers.label(worker), self._devices.label(device)
        outcome = outcome if outcome in _CACHE_EVENTS else OTHER
        for event in _CACHE_EVENTS.get(outcome, ()):
            self.cache.labels(worker, device, event).inc()
        self.load_seconds.labels(device, outcome).observe(seconds)
        self.last_load_seconds.labels(worker, device).set(seconds)


class BrokerObserver:
    """Feeds BrokerMetrics from the broker's traffic, so the routing core stays free of metrics.

    The broker calls ``incoming`` for each decoded message, ``outgoing`` for each message it
    sends and ``tick`` with its router on every timer round. Only messages the router let through
    reach ``outgoing`` (duplicate tokens are already dropped), so each request ends exactly once.
    """

    def __init__(self, metrics: BrokerMetrics):
        self.metrics = metrics
        self._started: dict[str, tuple[str, float]] = {}  # request id -> (model, submit time)
        self._first_token: dict[str, float] = {}
        self._loads_seen: set[str] = set()  # worker ids: a READY sent again is the same load
        self._models = LabelSet(MAX_MODEL_LABELS, UNKNOWN_MODEL)  # the names workers registered
        self._depth_models: set[str] = set()  # the queue depth series set so far

    def incoming(self, msg: object, now: float) -> None:
        if isinstance(msg, Submit):
            self._started.setdefault(msg.request_id, (msg.model, now))
        elif isinstance(msg, Partial):  # from the worker: a request without a stream gets none
            if msg.request_id in self._started:
                self._first_token.setdefault(msg.request_id, now)
        elif isinstance(msg, Ready):
            self._ready(msg)

    def outgoing(self, msg: object, now: float) -> None:
        if isinstance(msg, Final):
            usage = msg.completion.get("usage")
            tokens = usage.get("completion_tokens") if type(usage) is dict else None
            self._end(msg.request_id, "ok", now, tokens if type(tokens) is int and 0 < tokens < 2**53 else 0)
        elif isinstance(msg, Error) and msg.request_id:  # a code this broker does not know: its family
            self._end(msg.request_id, errors.from_wire(msg.code, "").code, now, 0)
        elif isinstance(msg, Request) and msg.request_id in self._started:
            # The submit may leave the model blank ("the only one served"); the dispatch names it.
            self._started[msg.request_id] = (msg.model, self._started[msg.request_id][1])
            self._models.add(msg.model)

    def tick(self, queues: Mapping[str, Sized], workers: Iterable[tuple[int, int]],
             supervised: Iterable[Mapping] = ()) -> None:
        """Queue depth per model; registered workers as (in flight, slots) pairs: busy when every
        slot is taken; ``supervised`` (serve's reports) adds those starting, backing off or failing."""
        self._queue_depths(queues)
        counts = dict.fromkeys(WORKER_STATES, 0)
        for inflight, slots in workers:
            counts["busy" if inflight >= slots else "ready"] += 1
        for entry in supervised:
            if entry.get("state") in _UNREGISTERED:
                counts[entry["state"]] += 1
        self.metrics.set_workers(counts)
        self.metrics.set_models(e for e in supervised if isinstance(e.get("model"), str)
                                and e.get("residency") in RESIDENCY_STATES)

    def _queue_depths(self, queues: Mapping[str, Sized]) -> None:
        """Per registered model, and the sum of the others as ``unknown``; a series set before
        whose queue is gone now reads 0 (the broker drops the queues of models no longer served)."""
        depths = dict.fromkeys(self._depth_models, 0)
        for model, queue in queues.items():
            label = model if model in self._models else UNKNOWN_MODEL
            depths[label] = depths.get(label, 0) + len(queue)
        for model, depth in depths.items():
            self.metrics.set_queue_depth(model, depth)
        self._depth_models = set(depths)

    def _ready(self, msg: Ready) -> None:
        for model in msg.models[:MAX_NAMES]:  # as many as the router registers
            self._models.add(model)
        if msg.models and msg.models[0] in self._models:
            self.metrics.add_model(msg.models[0])  # the primary name; the others are aliases
        outcome, seconds = msg.load.get("outcome"), msg.load.get("seconds")
        if (isinstance(outcome, str) and type(seconds) in (int, float)
                and msg.worker_id not in self._loads_seen):
            if len(self._loads_seen) >= MAX_WORKER_LABELS * 4:  # worker ids change with each start
                self._loads_seen.clear()
            self._loads_seen.add(msg.worker_id)
            self.metrics.observe_worker_load(msg.worker_id, msg.device, outcome, seconds)

    def _end(self, request_id: str, outcome: str, now: float, tokens: int) -> None:
        started = self._started.pop(request_id, None)
        first = self._first_token.pop(request_id, None)
        if started is None:
            return
        model, t0 = started
        label = model if model in self._models else UNKNOWN_MODEL
        self.metrics.observe_final(label, outcome, latency_s=now - t0,
                                   ttft_s=None if first is None else first - t0, completion_tokens=tokens)
