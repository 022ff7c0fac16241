"""What a graph's settings resolve to on a device (every ``auto`` replaced), and the OpenVINO
compile properties they give the dynamic graph and the decode graph."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import openvino as ov

from ovpool.config import GraphConfig
from ovpool.devices import device_type
from ovpool.errors import InvalidSettingError
from ovpool.worker.graph import cpu_class
from ovpool.worker.graph.cpu_class import CpuInfo


def resolve_auto(graph: GraphConfig | Mapping[str, Any], device: str = "CPU", core: ov.Core | None = None,
                 cpu: CpuInfo | None = None) -> dict:
    """Effective graph settings: ``auto`` replaced by what the device runs by default (its own
    choice: f16 on GPUs), except where ovpool measured a better choice: f32 compute on every CPU
    (the plugin's bf16 with AMX/AVX-512 BF16 is neither exact nor batch-independent), the KV cache,
    the weight encoding (ovpool.worker.graph.cpu_class, for ``cpu``, by default this host's)."""
    values = GraphConfig.coerce(graph).values()
    core = core or ov.Core()
    if device_type(device) == "CPU":
        return resolve_cpu(values, _type_name(core.get_property("CPU", "INFERENCE_PRECISION_HINT")),
                           cpu or CpuInfo.read(core))
    for name, prop in (("inference_precision", "INFERENCE_PRECISION_HINT"),
                       ("kv_cache_precision", "KV_CACHE_PRECISION")):
        if values[name] == "auto":
            values[name] = _type_name(core.get_property(device_type(device), prop))
    return _chosen(values, cpu_class.Defaults("float", "i4", "float", True, "none"))


def resolve_cpu(graph: Mapping[str, Any], plugin_precision: str, cpu: CpuInfo) -> dict:
    """``resolve_auto`` on a CPU of ``cpu``'s class whose plugin computes at ``plugin_precision``
    by itself (pure: docs/configuration.md's table of each class comes from it)."""
    values = dict(graph)
    if values["inference_precision"] == "auto":
        values["inference_precision"] = cpu_class.precision(plugin_precision)
    if values["inference_precision"] == "f16":
        raise InvalidSettingError(_f16_refused(cpu))
    if values["kv_cache_precision"] == "auto":
        # The CPU plugin's own default, u8, spends decode time dequantizing, and its per-block
        # scales make a sequence's numbers depend on how its blocks filled. f16 decodes 4-10%
        # faster than u8 on SmolLM2 at a 512-token context, but it is not the exact graph's
        # numbers, and it made the SDPA seam differ from the paged graph (AVX2 kernels; batched
        # and alone agree since lone passes are padded, lone_pass.py): f32 compute keeps f32 KV.
        values["kv_cache_precision"] = "f32" if values["inference_precision"] == "f32" else "f16"
    return _chosen(values, cpu_class.choose(cpu, values["inference_precision"], values["activations"]))


def _f16_refused(cpu: CpuInfo) -> str:
    """Why the CPU takes no ``inference_precision=f16`` (OpenVINO 2026.4.1; docs/performance.md,
    "AMX: f16 compute, measured")."""
    if "FP16" in cpu.capabilities:  # the plugin computes f16 here (avx512_fp16), wrongly
        why = ("its PagedAttention (every batched or prompt pass) returns NaN logits for a pass of "
               "more than one token, and it decompresses the 4-bit weights to f16 (2.6x the memory)")
    else:
        why = "the CPU plugin does not compute f16 on this CPU (it lists no FP16)"
    return f"inference_precision=f16 on the CPU: {why}; use f32 (the default) or bf16"


def _chosen(values: dict, chosen: cpu_class.Defaults) -> dict:
    for name in ("activations", "zero_points", "q4_storage", "kquant_requant"):
        if values[name] == "auto":
            values[name] = getattr(chosen, name)
    return values


def compile_config(graph: GraphConfig | Mapping[str, Any], device: str = "CPU", core: ov.Core | None = None,
                   weight_groups: Iterable[int] = ()) -> dict:
    """OpenVINO compile properties for the ``graph`` settings on ``device``; ``weight_groups``: the
    group sizes of the model's integer weights (ovpool.worker.graph.weights.int8_groups)."""
    values = resolve_auto(graph, device, core)
    config = {"INFERENCE_PRECISION_HINT": values["inference_precision"],
              "KV_CACHE_PRECISION": values["kv_cache_precision"]}
    if device_type(device) != "CPU":
        return config
    # Threads free to move between cores: a pinned one waits for its own core while other jobs
    # hold it, and every node's barrier waits for it (docs/performance.md, gemma3-270m against
    # llama.cpp).
    config["ENABLE_CPU_PINNING"] = False
    if values["activations"] == "float":
        # No int8 activations in the compressed MatMuls (the CPU plugin quantizes them where
        # VNNI/AMX exist, at any precision; on AVX2 this changes nothing): f32's exact numbers.
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0
    elif (group := cpu_class.activation_group(weight_groups)) != 32:
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = group
    return config


def decode_config(config: dict, threads: int = 0) -> dict:
    """The decode graph's compile properties, given the dynamic graph's ``config`` (CPU): without
    element-wise snippets except at f32, so that both graphs compute the same numbers; on
    ``threads`` threads (0: the dynamic graph's, see decode_threads)."""
    if threads:
        config = {**config, "INFERENCE_NUM_THREADS": threads}
    if config.get("INFERENCE_PRECISION_HINT") == "f32":
        return config
    return {**config, "SNIPPETS_MODE": "DISABLE"}


def decode_threads(threads: int, device: str = "CPU") -> int:
    """The decode graph's threads: ``threads`` (the ``decode_threads`` setting) on the CPU (0: the
    plugin's own choice, every core, as for the dynamic graph); other devices take no thread count."""
    return threads if device_type(device) == "CPU" else 0


def _type_name(element) -> str:
    return element.get_type_name() if isinstance(element, ov.Type) else str(element)
