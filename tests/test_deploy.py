"""deploy/ is valid for the tools that consume it, and every command line in it parses with our CLI."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from ovpool.cli import main as cli_main
from ovpool.settings import REGISTRY

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
UNITS = ("ovpool-broker.service", "ovpool-worker@.service", "ovpool-api.service")
# Variables the env file may set besides the settings: CLI options with an envvar, and logging.
CLI_ENV = {"OVPOOL_BIND", "OVPOOL_HTTP_BIND", "OVPOOL_MODEL", "OVPOOL_LOG_JSON", "OVPOOL_LOG_LEVEL"}
SETTING_ENV = {s.env for s in REGISTRY.values()}


def need_tool(name: str) -> str:
    """The tool's path; a missing tool skips locally but fails under CI=true (never a silent pass)."""
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is missing; CI installs it (.ci/run, pyproject dev extra)")
        pytest.skip(f"{name} is not installed")
    return path


def parses(argv: list[str]) -> None:
    """``ovpool ARGV`` parses (options exist, values have the right types) without running."""
    command = cli_main.get_command(click.Context(cli_main), argv[0])
    assert command is not None, f"no command ovpool {argv[0]}"
    command.make_context(argv[0], list(argv[1:]))


def env_file() -> dict[str, str]:
    text = (DEPLOY / "systemd" / "ovpool.env").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def exec_start(unit: str, instance: str = "GPU.0") -> list[str]:
    line = next(x for x in (DEPLOY / "systemd" / unit).read_text().splitlines() if x.startswith("ExecStart="))
    env = env_file()
    expanded = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], line.removeprefix("ExecStart="))
    return shlex.split(expanded.replace("%I", instance))


def test_systemd_units_pass_systemd_analyze_verify(tmp_path):
    analyze = need_tool("systemd-analyze")
    ovpool_bin = Path(sys.executable).parent / "ovpool"
    for unit in UNITS:  # verify checks that ExecStart exists: point it at this checkout's script
        text = (DEPLOY / "systemd" / unit).read_text().replace("/opt/ovpool/bin/ovpool", str(ovpool_bin))
        (tmp_path / unit).write_text(text)
    result = subprocess.run([analyze, "verify", "ovpool-broker.service", "ovpool-worker@GPU.0.service",
                             "ovpool-api.service"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    complaints = [x for x in (result.stdout + result.stderr).splitlines() if "ovpool" in x]
    assert result.returncode == 0 and not complaints, result.stdout + result.stderr


def test_systemd_verify_catches_a_broken_unit(tmp_path):
    analyze = need_tool("systemd-analyze")
    (tmp_path / "bad.service").write_text("[Service]\nExecStart=/nonexistent/ovpool broker\n")
    result = subprocess.run([analyze, "verify", "bad.service"], cwd=tmp_path, capture_output=True, timeout=60)
    assert result.returncode != 0


def test_unit_command_lines_parse_and_env_names_are_known():
    env = env_file()
    unknown = set(env) - SETTING_ENV - CLI_ENV
    assert not unknown, f"ovpool.env sets variables nothing reads: {unknown}"
    broker = exec_start("ovpool-broker.service")
    worker = exec_start("ovpool-worker@.service", "GPU.1")
    api = exec_start("ovpool-api.service")
    assert worker[worker.index("--device") + 1] == "GPU.1"
    assert api[api.index("--bind") + 1] == env["OVPOOL_HTTP_BIND"]
    for argv in (broker, worker, api):
        parses(argv[1:])


def manifests() -> list[Path]:
    return sorted((DEPLOY / "kubernetes").glob("*.yaml"))


def test_kubernetes_manifests_validate():
    validate = need_tool("kubernetes-validate")
    result = subprocess.run([validate, "--strict", *map(str, manifests())], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    docs = [doc for path in manifests() for doc in yaml.safe_load_all(path.read_text())]
    assert {"Deployment", "Service", "DaemonSet", "Secret", "ConfigMap"} <= {doc["kind"] for doc in docs}
    deployments = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert {"ovpool-broker", "ovpool-api"} <= deployments & services


def test_kubernetes_validate_rejects_a_misspelled_field(tmp_path):
    validate = need_tool("kubernetes-validate")
    bad = (DEPLOY / "kubernetes" / "broker.yaml").read_text().replace("containerPort", "containerport", 1)
    (tmp_path / "bad.yaml").write_text(bad)
    result = subprocess.run([validate, "--strict", str(tmp_path / "bad.yaml")], capture_output=True,
                            timeout=120)
    assert result.returncode != 0


def pod_spec(doc: dict) -> dict:
    """The pod spec a manifest runs: a workload's template, or a KServe runtime's own spec."""
    spec = doc.get("spec", {})
    return spec if doc["kind"] == "ServingRuntime" else spec.get("template", {}).get("spec", {})


def containers() -> list[dict]:
    return [c for path in manifests() for doc in yaml.safe_load_all(path.read_text())
            for c in pod_spec(doc).get("containers", [])]


def test_kubernetes_commands_parse_and_probes_exist():
    for container in containers():
        parses(container["args"])
        assert {"readinessProbe", "livenessProbe"} <= set(container), container["name"]
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if "exec" in container.get(probe, {}):
                assert container[probe]["exec"]["command"][0] == "ovpool"
                parses(container[probe]["exec"]["command"][1:])


# The fields KServe's CRDs define (kserve/kserve config/crd/full, commit aaac4e29, 2026-08-21):
# kubernetes-validate has no schema for them, so a misspelled field would pass it unseen.
SERVING_RUNTIME_SPEC = {"affinity", "annotations", "builtInAdapter", "containers", "disabled",
                        "grpcDataEndpoint", "grpcEndpoint", "hostIPC", "httpDataEndpoint",
                        "imagePullSecrets", "labels", "multiModel", "nodeSelector", "protocolVersions",
                        "replicas", "resourceClaims", "schedulerName", "storageHelper",
                        "supportedModelFormats", "tolerations", "volumes", "workerSpec"}
MODEL_FORMAT = {"autoSelect", "name", "priority", "version"}
ISVC_MODEL = {"args", "env", "envFrom", "modelFormat", "ports", "protocolVersion", "resources",
              "runtime", "runtimeVersion", "storage", "storageUri", "volumeMounts"}


def kserve_docs() -> dict[str, dict]:
    docs = yaml.safe_load_all((DEPLOY / "kubernetes" / "kserve-runtime.yaml").read_text())
    return {doc["kind"]: doc for doc in docs}


def test_kserve_runtime_uses_only_fields_its_crd_defines():
    runtime = kserve_docs()["ServingRuntime"]["spec"]
    assert set(runtime) <= SERVING_RUNTIME_SPEC, set(runtime) - SERVING_RUNTIME_SPEC
    for fmt in runtime["supportedModelFormats"]:
        assert set(fmt) <= MODEL_FORMAT and "name" in fmt
    assert [c["name"] for c in runtime["containers"]][0] == "kserve-container"
    mounts = {m["name"] for c in runtime["containers"] for m in c.get("volumeMounts", [])}
    assert mounts <= {v["name"] for v in runtime["volumes"]}


def test_kserve_runtime_pod_validates_as_a_kubernetes_pod(tmp_path):
    """Its containers and volumes are core PodSpec fields: checked strictly as a Pod."""
    validate = need_tool("kubernetes-validate")
    runtime = kserve_docs()["ServingRuntime"]["spec"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ovpool-kserve"},
           "spec": {"containers": runtime["containers"], "volumes": runtime["volumes"]}}
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(pod))
    result = subprocess.run([validate, "--strict", str(tmp_path / "pod.yaml")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_kserve_inference_service_names_the_runtime_and_a_format_it_serves():
    docs = kserve_docs()
    model = docs["InferenceService"]["spec"]["predictor"]["model"]
    assert set(model) <= ISVC_MODEL, set(model) - ISVC_MODEL
    runtime = docs["ServingRuntime"]
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["modelFormat"]["name"] in formats
    assert model["storageUri"].endswith(".gguf")


def test_containerfile_copies_existing_paths_and_its_command_parses():
    lines = (DEPLOY / "container" / "Containerfile").read_text().splitlines()
    root = DEPLOY.parent
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (root / source).exists(), f"Containerfile copies missing {source}"
    entry = next(x for x in lines if x.startswith("ENTRYPOINT"))
    cmd = next(x for x in lines if x.startswith("CMD"))
    assert yaml.safe_load(entry.split(None, 1)[1]) == ["ovpool"]
    parses(yaml.safe_load(cmd.split(None, 1)[1]))
