"""/metrics exports the gauges the Gateway API Inference Extension's endpoint picker reads, under
the names its model-server protocol documents (docs/proposals/003-model-server-protocol at
gateway-api-inference-extension v1.6.0: the vLLM column of its table)."""

from __future__ import annotations

from app_helpers import served_app
from prometheus_client.parser import text_string_to_metric_families

from ovpool.api import gateway_metrics

# The spec's table, vLLM column: TotalQueuedRequests, TotalRunningRequests, KVCacheUtilization
# (gauges), and BlockSize as the label block_size of vllm:cache_config_info.
SPEC = {"vllm:num_requests_waiting": "gauge", "vllm:num_requests_running": "gauge",
        "vllm:kv_cache_usage_perc": "gauge", "vllm:cache_config_info": "gauge"}


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _types(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_the_metrics_page_has_the_gateway_gauges_by_their_documented_names():
    with served_app() as http:
        page = http.get("/metrics")
        assert page.status_code == 200
    types = _types(page.text)
    assert {name: types.get(name) for name in SPEC} == SPEC
    samples = _samples(page.text)
    model = (("model_name", "m"),)
    assert samples[("vllm:num_requests_waiting", model)] == 0
    assert samples[("vllm:num_requests_running", model)] == 0
    assert samples[("vllm:kv_cache_usage_perc", model)] == 0
    assert samples[("vllm:cache_config_info", (("block_size", "32"),))] == 1
    assert any(name.startswith("ovpool_http_") for name in types)  # beside the API's own


def test_the_gauges_count_each_model_of_the_brokers_status():
    status = {"workers": [{"models": ["a", "a-alias"], "active": 3, "slots": 4},
                          {"models": ["a"], "active": 1, "slots": 4},
                          {"models": ["b"], "active": 0, "slots": 2}],
              "queues": {"a": 5, "b": 0, "gone": 0}}
    samples = _samples(gateway_metrics.render(status).decode())
    assert samples[("vllm:num_requests_waiting", (("model_name", "a"),))] == 5
    assert samples[("vllm:num_requests_running", (("model_name", "a"),))] == 4
    assert samples[("vllm:kv_cache_usage_perc", (("model_name", "a"),))] == 0.5
    assert samples[("vllm:kv_cache_usage_perc", (("model_name", "b"),))] == 0
    assert ("vllm:num_requests_waiting", (("model_name", "gone"),)) not in samples
    assert gateway_metrics.render(None) == b""  # no answer from the broker: no data, not an idle pool
