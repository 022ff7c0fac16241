"""The layers hold: lower floors import nothing of the worker, a client loads no NumPy or OpenVINO,
and every module that shapes a graph is in the compiled-model cache's fingerprint."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ovpool
from ovpool.cache.fingerprint import DeviceKey, GraphIdentity, fingerprint
from ovpool.worker.graph import builder

PACKAGE = Path(ovpool.__file__).parent
# What must not import the worker: the wire, the clients, the broker, the cache, the shared records
# and the HTTP API (a client of the pool).
BELOW_THE_WORKER = ["client.py", "async_client.py", "client_base.py", "pending.py", "protocol.py",
                    "prefix_key.py", "bounds.py", "pool_keys.py", "response_format.py",
                    "sampling_params.py", "completion.py", "errors.py", "settings.py", "timing.py",
                    "devices.py", "models.py", "auth.py", "endpoint.py", "metrics.py", "broker", "cache",
                    "api"]


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("part", BELOW_THE_WORKER)
def test_the_floors_below_the_worker_import_nothing_of_it(part):
    files = sorted((PACKAGE / part).rglob("*.py")) if (PACKAGE / part).is_dir() else [PACKAGE / part]
    for path in files:
        upward = sorted(m for m in imported_modules(path) if m.startswith("ovpool.worker"))
        assert not upward, f"{path.relative_to(PACKAGE)} imports {upward}"


def test_importing_the_clients_loads_neither_numpy_nor_openvino():
    code = ("import sys, ovpool.client, ovpool.async_client\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'openvino')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_graph_modules_loaded_by_a_load_are_all_in_the_builder_hash():
    # Derived, not listed: whatever ovpool.worker module a graph load imports must be hashed.
    code = ("import sys, ovpool.worker.graph.loading\n"
            "print('\\n'.join(m.__file__ for n, m in sys.modules.items() if n.startswith('ovpool.worker')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = {Path(line).resolve() for line in out.split()}
    assert loaded - {PACKAGE / "worker" / "__init__.py"} <= {p.resolve() for p in builder.builder_sources()}


def test_a_changed_byte_in_any_graph_module_changes_the_fingerprint(tmp_path):
    worker = tmp_path / "worker"
    for room in ("graph", "gguf"):
        shutil.copytree(PACKAGE / "worker" / room, worker / room,
                        ignore=shutil.ignore_patterns("__pycache__"))
    sources = builder.builder_sources(worker)
    assert [p.relative_to(worker) for p in sources] == \
        [p.relative_to(PACKAGE / "worker") for p in builder.builder_sources()]
    assert builder.source_hash(sources) == builder.BUILDER_HASH  # the copy hashes as the real one
    seen = {fingerprint_with(builder.BUILDER_HASH)}
    for path in sources:
        original = path.read_bytes()
        changed = bytearray(original or b"\n")
        changed[len(changed) // 2] ^= 0x01
        path.write_bytes(bytes(changed))
        seen.add(fingerprint_with(builder.source_hash(sources)))
        path.write_bytes(original)
    assert len(seen) == len(sources) + 1, "a module's change left the fingerprint as it was"


def fingerprint_with(builder_hash: str) -> str:
    """The cache family of one fixed graph whose builder hashes to ``builder_hash``."""
    identity = GraphIdentity(sources=[("model.gguf", [])], architecture="llama", hparams={"n_layers": 1},
                             builder_hash=builder_hash, ports=[], settings={}, source_identity="content")
    return fingerprint(identity, DeviceKey("CPU", "test"), {}, ov_version="test",
                       content_hash=lambda path: "same file").family
