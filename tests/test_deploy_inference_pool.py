"""deploy/kubernetes/inference-pool.yaml: the InferencePool selects the ovpool pods and their HTTP
port (the fields inference.networking.k8s.io/v1 requires), and each pod's probes and preStop are
wired to the drain, with a grace period longer than the drain's timeout."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from ovpool.api.app import Config, create_app
from ovpool.api.keys import ApiKeys
from ovpool.cli import main

KUBE = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"


def _docs(name: str) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((KUBE / name).read_text())}


def test_the_inference_pool_selects_the_pool_pods_and_their_http_port():
    docs = _docs("inference-pool.yaml")
    pool, pod = docs["InferencePool"], docs["Deployment"]["spec"]["template"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    ports = {p["containerPort"] for p in container["ports"]}
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == sorted(ports)
    assert pool["spec"]["endpointPickerRef"]["name"] and pool["spec"]["endpointPickerRef"]["port"]["number"]


def test_the_pool_pods_drain_on_stop_and_are_probed_on_the_drain_aware_routes():
    pod = _docs("inference-pool.yaml")["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    paths = {probe: container[probe]["httpGet"]["path"] for probe in ("readinessProbe", "livenessProbe")}
    assert paths == {"readinessProbe": "/health/ready", "livenessProbe": "/health/live"}
    routes = {route.path for route in create_app(Config("tcp://127.0.0.1:1", {}, ApiKeys(), 1)).routes}
    assert set(paths.values()) <= routes
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[:2] == ["ovpool", "drain"]
    parsed = CliRunner().invoke(main, [*pre_stop[1:], "--help"])
    assert parsed.exit_code == 0, parsed.output
    timeout = float(_docs("config.yaml")["ConfigMap"]["data"]["OVPOOL_SHUTDOWN_TIMEOUT_S"])
    for manifest in ("inference-pool.yaml", "api.yaml", "workers.yaml"):
        kind = "DaemonSet" if manifest == "workers.yaml" else "Deployment"
        grace = _docs(manifest)[kind]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > timeout, manifest
