"""The layers hold: lower floors import nothing of the worker, the broker, the API, the worker and
generation import only downwards, no modules import each other in a circle, a client loads no
NumPy or OpenVINO, and every module that shapes a graph is in the compiled-model cache's
fingerprint.

Imports are read from the source (at a module's top, inside a function or under TYPE_CHECKING: an
arrow all the same), each resolved to the ovpool module it names."""

from __future__ import annotations

import ast
import functools
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import ovpool
from ovpool.cache.fingerprint import DeviceKey, GraphIdentity, fingerprint
from ovpool.worker.graph import builder

PACKAGE = Path(ovpool.__file__).parent
# What may import the worker: the command line, the benchmarks and the test helpers that run it.
# Everything else outside ovpool.worker (the wire, the clients, the broker, the cache, the shared
# records, the HTTP API, serve's supervisor) must not.
ABOVE_THE_WORKER = ("ovpool.cli", "ovpool.bench", "ovpool.testing")
CLIENTS = ("ovpool.client", "ovpool.async_client", "ovpool.client_link", "ovpool.pending",
           "ovpool.stream_reader")
# (importer, what it must not import): each rule's reason is its assertion's message.
RULES = {
    ("ovpool.api", ("ovpool.broker",)): "the HTTP API is a client of the pool (ovpool.async_client)",
    ("ovpool.broker", ("ovpool.cache", *CLIENTS)): "the broker routes messages: no cache, no client",
    ("ovpool.worker", ("ovpool.broker",)): "a worker knows the broker by the wire protocol only",
    ("ovpool.worker.generate", ("ovpool.worker.engine", "ovpool.cache")):
        "generation is handed its graphs and requests: it reaches up to neither the Engine nor the cache",
}


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of ``package`` by its dotted name (a package by its ``__init__.py``)."""
    files = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imported_modules(path: Path) -> set[str]:
    """Every name ``path`` imports, at its top or inside a function (``from a import b``: a.b)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@functools.cache
def import_graph(package: Path = PACKAGE) -> dict[str, frozenset[str]]:
    """Each module of ``package`` and the modules of it that it imports."""
    files = module_files(package)

    def resolve(name: str) -> str | None:  # a.b.C -> the module a.b
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    return {module: frozenset(filter(None, map(resolve, imported_modules(path)))) - {module}
            for module, path in files.items()}


def inside(module: str, parts) -> bool:
    return any(module == part or module.startswith(part + ".") for part in parts)


def arrows(importers: Callable[[str], bool], targets) -> list[str]:
    """The imports of a module ``importers`` accepts into ``targets`` (or modules inside them)."""
    return [f"{module} -> {name}" for module, names in sorted(import_graph().items())
            if importers(module) for name in sorted(names) if inside(name, targets)]


def test_the_parts_the_rules_name_exist():
    named = {*ABOVE_THE_WORKER, *CLIENTS, *(part for (importer, targets) in RULES
                                            for part in (importer, *targets))}
    assert sorted(named - set(import_graph())) == []  # a moved module: move its rule with it


def test_the_floors_below_the_worker_import_nothing_of_it():
    assert arrows(lambda m: not inside(m, ("ovpool.worker", *ABOVE_THE_WORKER)), ["ovpool.worker"]) == []


@pytest.mark.parametrize("importer, targets", list(RULES), ids=[importer for importer, _ in RULES])
def test_each_layer_imports_only_downwards(importer, targets):
    assert arrows(lambda m: inside(m, [importer]), targets) == [], RULES[importer, targets]


def test_no_modules_import_each_other_in_a_circle():
    assert import_cycles(import_graph()) == []


def test_the_cycle_scan_finds_a_circle_of_lazy_imports(tmp_path):
    package = tmp_path / "ovpool"
    (package / "bench").mkdir(parents=True)
    sources = {"__init__.py": "", "bench/__init__.py": "", "bench/chat.py": "import ovpool.bench.peers\n",
               "bench/peers.py": "def run():\n    from ovpool.bench.chat import Turn\n",
               "bench/sweep.py": "from ovpool.bench import peers\n"}
    for path, text in sources.items():
        (package / path).write_text(text)
    assert import_cycles(import_graph(package)) == [["ovpool.bench.chat", "ovpool.bench.peers"]]


def import_cycles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """The modules that import each other in a circle, each circle sorted (strongly connected
    components of more than one module; Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            step = next((n for n in edges if n not in index or n in stack), None)
            if step is not None and step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                work.append((step, iter(sorted(graph[step]))))
                continue
            if step is not None:
                low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = stack[stack.index(node):]
                del stack[stack.index(node):]
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


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
