"""Broker metrics as a Prometheus scraper sees them: served over HTTP and parsed."""

from __future__ import annotations

import socket
import threading
import urllib.request

import pytest
from serve_helpers import scrape, wait_for

from ovpool import timing
from ovpool.broker import metrics_http
from ovpool.broker.metrics import BrokerMetrics, BrokerObserver
from ovpool.broker.metrics_http import MetricsServer


@pytest.fixture
def served():
    metrics = BrokerMetrics()
    with MetricsServer(metrics.registry, port=0, host="127.0.0.1") as server:
        yield metrics, server.port


def test_requests_latency_and_tokens_are_scraped(served):
    metrics, port = served
    metrics.observe_final("smollm2", "ok", latency_s=1.2, ttft_s=0.2, completion_tokens=11)
    metrics.observe_final("smollm2", "ok", latency_s=0.3, ttft_s=0.1, completion_tokens=1)
    metrics.observe_final("smollm2", "request.timeout", latency_s=30.0)
    got = scrape(port)
    m = (("model", "smollm2"),)
    assert got[("ovpool_requests_total", (("model", "smollm2"), ("outcome", "ok")))] == 2
    assert got[("ovpool_requests_total", (("model", "smollm2"), ("outcome", "request.timeout")))] == 1
    assert got[("ovpool_request_latency_seconds_count", m)] == 3
    assert got[("ovpool_request_latency_seconds_sum", m)] == pytest.approx(31.5)
    assert got[("ovpool_time_to_first_token_seconds_count", m)] == 2
    assert got[("ovpool_tokens_generated_total", m)] == 12
    # Decode speed only where it is defined: 10 tokens after the first in 1.0 s.
    assert got[("ovpool_request_tokens_per_second_count", m)] == 1
    assert got[("ovpool_request_tokens_per_second_sum", m)] == pytest.approx(10.0)


def test_queue_depth_and_workers_by_state(served):
    metrics, port = served
    metrics.set_queue_depth("smollm2", 7)
    metrics.set_workers({"ready": 2, "failing": 1})
    metrics.set_workers({"ready": 3})
    got = scrape(port)
    assert got[("ovpool_queue_depth", (("model", "smollm2"),))] == 7
    assert got[("ovpool_workers", (("state", "ready"),))] == 3
    assert got[("ovpool_workers", (("state", "failing"),))] == 0


def test_worker_cache_events_and_load_time(served):
    metrics, port = served
    metrics.observe_worker_load("w0", "CPU", "wrote", 9.5)
    metrics.observe_worker_load("w1", "CPU", "hit", 0.4)
    metrics.observe_worker_load("w1", "CPU", "hit", 0.3)
    got = scrape(port)

    def cache(worker: str, event: str) -> float:
        return got.get(("ovpool_worker_cache_total",
                        (("device", "CPU"), ("event", event), ("worker", worker))), 0)

    assert (cache("w0", "misses"), cache("w0", "writes"), cache("w0", "hits")) == (1, 1, 0)
    assert (cache("w1", "hits"), cache("w1", "misses")) == (2, 0)
    assert got[("ovpool_worker_last_load_seconds", (("device", "CPU"), ("worker", "w1")))] == 0.3
    assert got[("ovpool_worker_load_seconds_count", (("device", "CPU"), ("outcome", "hit")))] == 2


def test_server_stops_on_exit():
    metrics = BrokerMetrics()
    with MetricsServer(metrics.registry, port=0, host="127.0.0.1") as server:
        port = server.port
        assert scrape(port) is not None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_observer_turns_broker_traffic_into_request_metrics():
    from ovpool.broker.metrics import BrokerObserver
    from ovpool.protocol import Error, Final, Partial, Request, Submit

    metrics = BrokerMetrics()
    obs = BrokerObserver(metrics)
    obs.incoming(Submit("r1", "", {}, prompt="hi"), 10.0)
    obs.incoming(Submit("r1", "", {}, prompt="hi"), 10.5)  # a client resend keeps the first time
    obs.outgoing(Request("r1", "smollm2", {}, prompt="hi"), 10.6)
    obs.incoming(Partial("r1", 0, 5, "a", 0), 11.0)
    obs.incoming(Partial("r1", 1, 6, "b", 1), 11.5)
    obs.outgoing(Final("r1", {"usage": {"prompt_tokens": 2, "completion_tokens": 2}}), 12.0)
    obs.incoming(Submit("r2", "smollm2", {}, prompt="x"), 20.0)
    obs.outgoing(Error("r2", "request.queue_full", "full"), 20.001)
    obs.outgoing(Error("", "protocol.malformed", "junk"), 21.0)  # not a request: not counted
    obs.tick({"smollm2": ["r3", "r4"]}, [(8, 8), (1, 8), (0, 8)])

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert value("ovpool_requests_total", model="smollm2", outcome="ok") == 1
    assert value("ovpool_requests_total", model="smollm2", outcome="request.queue_full") == 1
    assert value("ovpool_request_latency_seconds_sum", model="smollm2") == pytest.approx(2.0 + 0.001)
    assert value("ovpool_time_to_first_token_seconds_sum", model="smollm2") == pytest.approx(1.0)
    assert value("ovpool_request_tokens_per_second_sum", model="smollm2") == pytest.approx(1.0)
    assert value("ovpool_queue_depth", model="smollm2") == 2
    assert (value("ovpool_workers", state="busy"), value("ovpool_workers", state="ready")) == (1, 2)
    assert value("ovpool_requests_total", model="unrouted", outcome="protocol.malformed") is None


def test_a_served_model_has_a_queue_depth_before_any_request():
    from ovpool.broker.metrics import BrokerObserver
    from ovpool.protocol import Ready

    metrics = BrokerMetrics()
    obs = BrokerObserver(metrics)
    obs.incoming(Ready("w0", ["tiny", "/models/tiny.gguf"], "CPU", 4, "h", 1), 0.0)
    obs.incoming(Ready("w1", [], "CPU", 4, "h", 2), 0.0)  # malformed: the router drops it, no crash here
    assert metrics.registry.get_sample_value("ovpool_queue_depth", {"model": "tiny"}) == 0
    obs.tick({"tiny": ["r1"]}, [])
    obs.incoming(Ready("w2", ["tiny"], "CPU", 4, "h", 3), 1.0)  # a later worker keeps the depth
    assert metrics.registry.get_sample_value("ovpool_queue_depth", {"model": "tiny"}) == 1


def test_observer_counts_each_workers_load_once_and_unregistered_supervised_workers():
    from ovpool.broker.metrics import BrokerObserver
    from ovpool.protocol import Ready

    metrics = BrokerMetrics()
    obs = BrokerObserver(metrics)
    wrote = Ready("w0@h:1", ["tiny"], "CPU", 4, "h", 1, {"outcome": "wrote", "seconds": 9.5, "entry": "e"})
    obs.incoming(wrote, 0.0)
    obs.incoming(wrote, 5.0)  # registering again (the broker asked it to) is not a second load
    obs.incoming(Ready("w1@h:2", ["tiny"], "CPU", 4, "h", 2, {"outcome": "hit", "seconds": 0.4}), 0.0)
    obs.incoming(Ready("w2@h:3", ["tiny"], "CPU", 4, "h", 3), 0.0)  # null backend: no load to count
    obs.tick({}, [(0, 4), (0, 4)], [{"state": "failing"}, {"state": "backoff"}, {"state": "stopped"}])

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert value("ovpool_worker_cache_total", worker="w0@h:1", device="CPU", event="writes") == 1
    assert value("ovpool_worker_cache_total", worker="w0@h:1", device="CPU", event="misses") == 1
    assert value("ovpool_worker_cache_total", worker="w1@h:2", device="CPU", event="hits") == 1
    assert value("ovpool_worker_load_seconds_count", device="CPU", outcome="wrote") == 1
    assert value("ovpool_worker_load_seconds_count", device="CPU", outcome="hit") == 1
    states = ("ready", "failing", "backoff", "starting")
    assert [value("ovpool_workers", state=s) for s in states] == [2, 1, 1, 0]


def test_prefix_cache_tokens_per_worker_and_the_routers_prefix_hits(served):
    metrics, port = served
    metrics.set_prefix([("w1@h:1", 1200, 900), ("w2@h:2", 300, 0)], hits=7, misses=2)
    got = scrape(port)
    assert got[("ovpool_worker_prompt_tokens", (("worker", "w1@h:1"),))] == 1200
    assert got[("ovpool_worker_cached_prompt_tokens", (("worker", "w1@h:1"),))] == 900
    assert got[("ovpool_worker_cached_prompt_tokens", (("worker", "w2@h:2"),))] == 0
    assert got[("ovpool_prefix_routed", (("outcome", "hit"),))] == 7
    assert got[("ovpool_prefix_routed", (("outcome", "miss"),))] == 2


def drive(router, observer, peer, msg, now):
    """What the broker loop does with one message: observe it, route it, observe the replies."""
    observer.incoming(msg, now)
    for _, out in router.handle(peer, msg, now):
        observer.outgoing(out, now)


def tick(router, observer, now):
    for _, out in router.tick(now):
        observer.outgoing(out, now)
    observer.tick(router.queues, [(len(w.inflight), w.info.slots) for w in router.workers.values()])


def test_requests_for_2000_unknown_models_add_a_few_series_at_most():
    from prometheus_client import generate_latest

    from ovpool.broker.router import Router
    from ovpool.protocol import Final, Ready, Submit

    metrics = BrokerMetrics()
    obs, router = BrokerObserver(metrics), Router(now=0.0)
    drive(router, obs, b"w", Ready("w0", ["tiny"], "CPU", 4, "h", 1), 0.5)
    drive(router, obs, b"c", Submit("ok", "tiny", {}, prompt="hi"), 0.5)
    drive(router, obs, b"w", Final("ok", {"usage": {"completion_tokens": 3}}), 0.6)
    tick(router, obs, 0.7)
    before = len(generate_latest(metrics.registry))
    for i in range(1000):  # a restarted broker's grace: some wait for their model, most fail at once
        drive(router, obs, b"c", Submit(f"a{i}", f"nope-{i}", {}, prompt="hi"), 1.0)
    tick(router, obs, 1.0)
    tick(router, obs, timing.BROKER_GRACE_S + 2)  # the waiting ones fail after the grace
    for i in range(1000):
        drive(router, obs, b"c", Submit(f"b{i}", f"late-{i}", {}, prompt="hi"), timing.BROKER_GRACE_S + 3)
    tick(router, obs, timing.BROKER_GRACE_S + 3)
    text = generate_latest(metrics.registry).decode()
    assert len(text) - before < 4096, f"{before} bytes before, {len(text)} after"
    assert "nope-" not in text and "late-" not in text
    assert metrics.registry.get_sample_value(
        "ovpool_requests_total", {"model": "unknown", "outcome": "request.model_not_found"}) == 2000
    assert metrics.registry.get_sample_value("ovpool_queue_depth", {"model": "unknown"}) == 0


def test_hostile_worker_reports_get_a_bounded_set_of_labels():
    from ovpool.broker.metrics import MAX_DEVICE_LABELS, MAX_WORKER_LABELS, BrokerObserver
    from ovpool.protocol import Error, Final, Ready, Submit

    metrics = BrokerMetrics()
    obs = BrokerObserver(metrics)
    for i in range(3000):
        load = {"outcome": f"o{i}", "seconds": 1.0}
        obs.incoming(Ready(f"w{i}", [f"m{i}"], f"DEV{i}", 1, "h", i, load), 0.0)
    obs.incoming(Submit("r1", "m1", {}, prompt="hi"), 1.0)
    obs.outgoing(Final("r1", {"usage": [1]}), 2.0)  # malformed usage: counted, no tokens
    obs.incoming(Submit("r2", "m1", {}, prompt="hi"), 1.0)
    obs.outgoing(Final("r2", {"usage": {"completion_tokens": -5}}), 2.0)
    obs.incoming(Submit("r3", "m1", {}, prompt="hi"), 1.0)
    obs.outgoing(Error("r3", "request.made.up", "x"), 2.0)  # an unknown code counts as its family
    labels = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            for name, value in sample.labels.items():
                labels.setdefault(name, set()).add(value)
    assert len(labels["worker"]) == MAX_WORKER_LABELS + 1  # and "other"
    assert len(labels["device"]) == MAX_DEVICE_LABELS + 1
    assert labels["outcome"] <= {"ok", "request", "other"}
    assert metrics.registry.get_sample_value("ovpool_requests_total", {"model": "m1", "outcome": "ok"}) == 2
    assert metrics.registry.get_sample_value("ovpool_tokens_generated_total", {"model": "m1"}) is None


def test_prefix_gauges_are_kept_only_for_the_workers_registered_now():
    metrics = BrokerMetrics()
    metrics.set_prefix([("w1@h:1", 10, 5), ("w2@h:2", 20, 0)], hits=0, misses=0)
    metrics.set_prefix([("w2@h:2", 30, 1)], hits=1, misses=0)  # w1 left (or restarted as another pid)
    value = metrics.registry.get_sample_value
    assert value("ovpool_worker_prompt_tokens", {"worker": "w1@h:1"}) is None
    assert value("ovpool_worker_prompt_tokens", {"worker": "w2@h:2"}) == 30


def _handler_threads() -> int:
    return sum(t.name.endswith("(process_request_thread)") for t in threading.enumerate())


def test_idle_connections_hold_no_more_than_max_scrapes_threads_and_only_for_the_timeout(
        monkeypatch, capfd):
    """prometheus_client's server gave each connection a thread for as long as it stayed open:
    300 idle connections were 300 threads in the broker, for ever."""
    monkeypatch.setattr(metrics_http._Handler, "timeout", 3.0)  # SCRAPE_TIMEOUT_S, shortened
    wait_for(lambda: not _handler_threads(), 60, "earlier tests' scrapes to end")
    metrics = BrokerMetrics()
    metrics.observe_final("m", "ok", latency_s=1.0, ttft_s=0.5, completion_tokens=3)
    with MetricsServer(metrics.registry, port=0, host="127.0.0.1") as server:
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=60) for _ in range(100)]
        try:
            # Accepted in order: once the last 50 are closed (past the cap, at once), the first
            # MAX_SCRAPES hold a thread each, until the timeout (waited for, not slept).
            closed = sum(s.recv(1) == b"" for s in idle[-50:])
            held = _handler_threads()
            wait_for(lambda: not _handler_threads(), 60, "the held ones to time out")
            scraped = scrape(server.port)
        finally:
            for s in idle:
                s.close()
    assert held == metrics_http.MAX_SCRAPES and closed == 50
    assert scraped[("ovpool_requests_total", (("model", "m"), ("outcome", "ok")))] == 1  # it serves again
    assert "Traceback" not in capfd.readouterr().err  # a peer's timeout is no news
