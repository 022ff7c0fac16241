"""deploy/kubernetes: the HTTP API is probed on its health routes (ready: /health, the pool can
serve; live: /health/live, its broker client reads; /metrics answered while that client was dead),
and the broker's CURVE keys sit by role."""

from __future__ import annotations

from pathlib import Path

import yaml

from ovpool.api.app import Config, create_app
from ovpool.api.keys import ApiKeys

KUBE = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"


def _container(manifest: str, name: str) -> tuple[dict, dict]:
    """(the container, its pod spec) of the Deployment in ``manifest``."""
    for doc in yaml.safe_load_all((KUBE / manifest).read_text()):
        if doc["kind"] == "Deployment":
            pod = doc["spec"]["template"]["spec"]
            return next(c for c in pod["containers"] if c["name"] == name), pod
    raise AssertionError(f"no Deployment in {manifest}")


def test_the_http_api_is_live_and_ready_by_its_health_endpoint():
    api, _ = _container("api.yaml", "api")
    paths = {probe: api[probe]["httpGet"]["path"] for probe in ("livenessProbe", "readinessProbe")}
    assert paths == {"livenessProbe": "/health/live", "readinessProbe": "/health/ready"}
    routes = {route.path for route in create_app(Config("tcp://127.0.0.1:1", {}, ApiKeys(), 1)).routes}
    assert set(paths.values()) <= routes


def test_the_broker_gets_client_and_worker_keys_in_their_own_directories():
    broker, pod = _container("broker.yaml", "broker")
    env = {e["name"]: e["value"] for e in broker["env"]}
    mount = broker["volumeMounts"][0]["mountPath"]
    items = {i["path"]: i["key"] for v in pod["volumes"] for i in v["secret"]["items"]}
    assert env["OVPOOL_CURVE_ALLOWED_KEYS"] == f"{mount}/allowed"
    assert env["OVPOOL_CURVE_WORKER_KEYS"] == f"{mount}/workers"
    assert items["allowed/client.key"] == "client.key" and items["workers/worker.key"] == "worker.key"
    assert not [p for p in items if p.startswith(("allowed/", "workers/")) and p.endswith("_secret")]
