"""Prometheus metrics of the HTTP API (``GET /metrics``), one registry per app.

Names start with ``ovpool_http_`` so they sit beside the broker's ``ovpool_*`` in one Prometheus.
Time to first token and inter-token latency are observed on streamed requests (a non-streamed
one has no first token to see); end-to-end latency and tokens on every request.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

# Seconds; a first token on a CPU takes milliseconds to seconds, later ones ~10-100 ms.
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ApiMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self._children: dict[tuple, object] = {}
        self.requests = Counter("ovpool_http_requests", "HTTP requests by endpoint and status (a stream "
                                "that failed after its first token: its error's status)",
                                ["endpoint", "status"], registry=r)
        self.ttft = Histogram("ovpool_http_time_to_first_token_seconds", "Request to first streamed token",
                              ["endpoint"], buckets=_TTFT_BUCKETS, registry=r)
        self.itl = Histogram("ovpool_http_inter_token_latency_seconds", "Between streamed tokens",
                             ["endpoint"], buckets=_ITL_BUCKETS, registry=r)
        self.latency = Histogram("ovpool_http_request_latency_seconds", "Request to its last byte",
                                 ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("ovpool_http_tokens", "Tokens by direction: in (prompt), out (completion)",
                              ["endpoint", "direction"], registry=r)

    def finished(self, endpoint: str, status: int, seconds: float) -> None:
        self._child(self.requests, endpoint, str(status)).inc()
        self._child(self.latency, endpoint).observe(seconds)

    def counted(self, endpoint: str, usage: dict[str, int]) -> None:
        self._child(self.tokens, endpoint, "in").inc(usage["prompt_tokens"])
        self._child(self.tokens, endpoint, "out").inc(usage["completion_tokens"])

    def first_token(self, endpoint: str, seconds: float) -> None:
        self._child(self.ttft, endpoint).observe(seconds)

    def next_token(self, endpoint: str, seconds: float) -> None:
        self._child(self.itl, endpoint).observe(seconds)

    def _child(self, metric, *labels: str):
        # labels() checks and joins its arguments on every call; a dict lookup is cheaper.
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def render(self) -> bytes:
        return generate_latest(self.registry)
