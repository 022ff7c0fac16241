"""Which graph an Engine runs, and how it gets it compiled: through the compiled-model cache.

Two graph variants serve one sequence: the stateful graph (KV cache in state variables, SDPA) and
the paged graph (ovpool.worker.graph.paged: KV cache in blocks, OpenVINO's PagedAttentionExtension, the
same graph the worker batches with). On the CPU the paged graph is the faster one: its attention
kernel skips the masked half of a causal prefill, which SDPA computes (SmolLM2, 512-token prompt:
~100 ms of attention instead of ~370 ms). ``attention=auto`` therefore picks it, except where
it would make a cache useless: OpenVINO 2026.4's CPU plugin cannot re-import an exported paged
graph (``reimport_problem``), so with a cache directory on such a device auto means the stateful
graph, which imports from the cache in a fraction of a compile. The worker's batching graph is
the paged one all the same: there the cache keeps its IR (ovpool.cache.ir), so a start, cache-only
ones included, reads that instead of the GGUF and compiles it in the background.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import openvino as ov
import openvino.opset13 as ops

from ovpool import json_files
from ovpool.cache.fingerprint import GraphIdentity
from ovpool.cache.ir import ir_lookup, load_ir
from ovpool.cache.loader import LoadResult, compile_model, load_compiled
from ovpool.cache.prefetch import BlobImport
from ovpool.cache.store import CacheStore
from ovpool.config import GraphConfig, WorkerConfig
from ovpool.devices import device_type
from ovpool.errors import CacheError
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.graph import builder as graph
from ovpool.worker.graph import compile_settings
from ovpool.worker.graph import decode as decode_graph
from ovpool.worker.graph.arena import ConstantArena
from ovpool.worker.graph.paged import PagedAttention, read_ir
from ovpool.worker.graph.weights import Encoding, int8_groups

log = logging.getLogger("ovpool.worker")


def choose_attention(graph_config: GraphConfig, device: str, core: ov.Core,
                     cache_dir: str | Path | None) -> str:
    """The attention the engine's single-stream graph uses: the setting, with ``auto`` resolved
    to ``paged`` (stateful off: ``sdpa``; a cache directory on a device that cannot re-import
    paged graphs: ``sdpa``)."""
    if graph_config.attention != "auto":
        return graph_config.attention
    if not graph_config.stateful or (cache_dir and reimport_problem(core, device, cache_dir)):
        return "sdpa"
    return "paged"


def cache_identity(model: GGUFModel, config: WorkerConfig, device: str,
                   core: ov.Core, attention=None) -> tuple[GraphIdentity, dict]:
    """The cache identity and compile config of ``model`` on ``device``, without building the graph
    (also used by ``ovpool cache explain``); ``attention``: a graph variant, see graph.port_spec."""
    graph_settings = compile_settings.resolve_auto(config.graph, device, core)
    ports = graph.port_spec(model.hparams, graph_settings, attention)
    identity = GraphIdentity.from_model(
        model, ports=ports, builder_hash=graph.BUILDER_HASH,
        settings=graph_settings, source_identity=config.source_identity)
    groups = int8_groups(model, Encoding.of(GraphConfig.from_values(graph_settings)))
    return identity, compile_settings.compile_config(graph_settings, device, core, groups)


def load_graph(model: GGUFModel, config: WorkerConfig, device: str, core: ov.Core, *,
               cache_dir: str | Path | None, cache_only: bool, hint: str | None = None,
               early: BlobImport | None = None) -> LoadResult:
    """The compiled graph for ``config.graph.attention`` (resolved: see choose_attention); ``hint``
    and ``early``: see load_compiled."""
    if config.graph.attention == "paged":
        return load_paged(model, config, device, core, cache_dir=cache_dir, cache_only=cache_only,
                          hint=hint, early=early)
    identity, compile_config = cache_identity(model, config, device, core)
    values = dict(identity.settings)
    arena = ConstantArena.open()
    result = load_compiled(core, identity=identity, device=device, config=compile_config,
                           build=lambda: graph.build_model(model, values, arena=arena),
                           cache_dir=cache_dir, cache_only=cache_only, hint=hint, early=early,
                           lock_timeout_s=config.cache_lock_timeout_s)
    return _with_arena(result, arena)


def load_paged(model: GGUFModel, config: WorkerConfig, device: str, core: ov.Core, *,
               cache_dir: str | Path | None, cache_only: bool, hint: str | None = None,
               early: BlobImport | None = None) -> LoadResult:
    """The paged graph of ``model``: its ports differ from the stateful graph's, so it has its own
    exact cache entry; where the device cannot import it (``reimport_problem``), its IR is cached
    instead and compiled at each start (``_compiled_from_ir``)."""
    attention = PagedAttention()
    config = config.with_graph(attention="paged")  # whatever single streams use
    identity, compile_config = cache_identity(model, config, device, core, attention)
    values = dict(identity.settings)
    built: list[ov.Model] = []
    arena = ConstantArena.open()  # both graphs' constants: see ovpool.worker.graph.arena

    def build() -> ov.Model:
        built.append(graph.build_model(model, values, attention, arena))
        return built[-1]

    if cache_dir and reimport_problem(core, device, cache_dir):
        result = _compiled_from_ir(core, identity, device, compile_config, build, built, cache_dir=cache_dir,
                                   cache_only=cache_only, lock_timeout_s=config.cache_lock_timeout_s)
    else:
        result = load_compiled(core, identity=identity, device=device, config=compile_config, build=build,
                               cache_dir=cache_dir, cache_only=cache_only, hint=hint, early=early,
                               lock_timeout_s=config.cache_lock_timeout_s)
    result = _with_arena(result, arena)
    paying = decode_graph.pays(device, values["inference_precision"], core)
    if not decode_graph.wanted(config.decode_graph, device, model, paying):
        return result

    def source() -> ov.Model:  # later, on the decode graph's thread
        if built:
            # Kept, not built again: the compiled graph holds these constants anyway, and a decode
            # graph made from them shares them (SmolLM2: +220 MiB RSS for it instead of +380).
            return built.pop()
        with GGUFModel.open(model.path) as again:  # imported from a cache: build it now
            return graph.build_model(again, values, attention, arena)

    threads = compile_settings.decode_threads(config.decode_threads, device)
    decode = decode_graph.DecodeGraph(source, core, device,
                                      compile_settings.decode_config(compile_config, threads))
    return dataclasses.replace(result, decode=decode)


def _with_arena(result: LoadResult, arena: ConstantArena | None) -> LoadResult:
    """``result`` owning ``arena`` (its built constants), which also releases the pages of the
    cache file a hit runs on (ovpool.worker.graph.arena)."""
    if arena is not None and result.blob is not None and result.blob.pages is not None:
        arena.adopt(result.blob.pages)
    return dataclasses.replace(result, arena=arena)


def _compiled_from_ir(core: ov.Core, identity: GraphIdentity, device: str, config: dict, build,
                      built: list[ov.Model], **cache: Any) -> LoadResult:
    """The paged graph compiled from the cache's IR of it (outcome ``ir-hit``), or built from the
    GGUF with its IR exported for the next start (``ir-wrote``; ``compiled`` if it could not be);
    cache-only mode without that IR raises CacheMissError (ovpool.cache.ir)."""
    start = time.perf_counter()
    ir = load_ir(core, identity=identity, device=device, config=config, build=build, read=read_ir, **cache)
    if ir.outcome == "hit":
        built.append(ir.model)  # the decode graph's source, as a built one would be
    try:
        compiled = compile_model(core, ir.model, device, config)
    except BaseException:
        if ir.weights is not None:
            ir.weights.close()
        raise
    outcome = {"hit": "ir-hit", "wrote": "ir-wrote"}.get(ir.outcome, "compiled")
    log.info("batching graph compiled in %.1f s (%s: the cache keeps its IR, not its compiled form)",
             time.perf_counter() - start, reimport_problem(core, device))
    return LoadResult(compiled, outcome, ir.entry, time.perf_counter() - start, blob=ir.weights)


def batching_plan(model: GGUFModel, config: WorkerConfig, device: str, core: ov.Core, *,
                  cache_dir: str | Path | None, cache_only: bool) -> str:
    """Whether a worker of ``model`` batches (continuous batching: the paged graph) and how it
    gets that graph, in one plain line for ``ovpool status`` and ``ovpool cache explain``.
    Reads the cache's manifests only (no blob, no weight)."""
    if config.batching != "paged":
        return f"off: setting batching={config.batching}"
    why = reimport_problem(core, device, cache_dir) if cache_dir else None
    if why is None:
        return "on" + (" (its compiled graph comes from the cache like the others)" if cache_dir else "")
    attention = PagedAttention()
    identity, compile_config = cache_identity(model, config.with_graph(attention="paged"), device, core,
                                              attention)
    try:
        entry, reason = ir_lookup(core, cache_dir, identity, device, compile_config).find(repair=False)
    except CacheError as exc:
        entry, reason = None, str(exc)
    if entry is not None:
        return f"on, its graph compiled at each start from the cache's IR ({why}): not cache-only"
    if cache_only:
        return (f"off: {why}, and cache-only mode found no IR of it in the cache ({reason}); start "
                f"once without cache-only to add it")
    return f"on, its graph built and compiled at start ({why}); its IR is cached for the next start"


_REIMPORT: dict[str, str | None] = {}
_TYPES = {"i32": ov.Type.i32, "i64": ov.Type.i64, "dynamic": ov.Type.dynamic}


def reimport_problem(core: ov.Core, device: str, cache_dir: str | Path | None = None) -> str | None:
    """Why ``device``'s plugin cannot import an exported paged-attention graph, in plain words;
    None if it can.

    OpenVINO 2026.4's CPU plugin needs the op's head sizes from node rt_info, which an exported blob
    does not keep (OpenVINO's words, logged at debug level: "Runtime info k_head_size and
    num_k_heads are required for PagedAttention node"). Probed on a one-layer graph (~0.05 s of
    CPU), so a fixed OpenVINO gets the cache with no change here: once per process and device, and
    once per OpenVINO version and device for a ``cache_dir`` (which keeps the answers).
    """
    if device not in _REIMPORT:
        store = CacheStore(cache_dir) if cache_dir else None
        known, key = _known_problems(store), f"paged import {ov.get_version()} {device}"
        if key not in known:
            known[key] = _probe(core, device)
            _keep_problems(store, known)
        _REIMPORT[device] = known[key]
    return _REIMPORT[device]


def _probe(core: ov.Core, device: str) -> str | None:
    compiled = core.compile_model(_probe_model(), device)
    with compiled.export_model() as stream:
        blob = stream.getvalue()
    try:
        core.import_model(blob, device)
        return None
    except RuntimeError as exc:  # translated here, once: OpenVINO's text names its internals
        log.debug("paged graph re-import probe on %s: %s", device, exc)
        version = ov.get_version().split("-")[0]
        return f"OpenVINO {version} cannot import a compiled paged-attention graph on {device_type(device)}"


def _known_problems(store: CacheStore | None) -> dict[str, str | None]:
    try:
        known = json_files.loads(store.probes_path.read_text()) if store else {}
    except (OSError, ValueError):
        return {}  # none kept yet, or a torn-up file: probe again and replace it
    return known if isinstance(known, dict) else {}


def _keep_problems(store: CacheStore | None, known: dict[str, str | None]) -> None:
    if store is not None:
        with contextlib.suppress(OSError):  # a read-only cache: probe again next time
            store.prepare()
            store.write_text(store.probes_path, json.dumps(known, indent=1, sort_keys=True))


def _probe_model() -> ov.Model:
    attention = PagedAttention()
    params = {p["name"]: ops.parameter(ov.PartialShape(p["partial_shape"]), _TYPES[p["element_type"]],
                                       name=p["name"])
              for p in attention.ports(SimpleNamespace(n_layers=1))}
    x = ops.parameter([1, -1, 1, 8], ov.Type.f32, name="x")  # [batch, tokens, heads, head_dim]
    out = attention.attend(params, 0, x.output(0), x.output(0), x.output(0), 8 ** -0.5)
    return ov.Model([ops.result(out)], [x, *params.values()])
