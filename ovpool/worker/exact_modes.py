"""What ``auto`` means for the generation features whose tokens depend on the graph's numbers:
each is on only where it leaves every answer as it is without it (pure functions of the resolved
graph settings; the measurements: docs/prefix-caching.md, docs/prompt-lookup.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ovpool.devices import device_type
from ovpool.worker.graph.cpu_class import CpuInfo


def resolve_prompt_lookup(mode: str, graph_settings: Mapping[str, Any]) -> str:
    """Setting ``prompt_lookup``'s ``mode`` on a graph of ``graph_settings``: ``auto`` stays auto
    (per sequence, where it pays) on the exact f32 graph, where a pass over several positions
    computes each row as a one-position pass does, else it is off (with int8 activations
    a position's logits differ between the two: docs/performance.md, Quality)."""
    exact = graph_settings["inference_precision"] == "f32" and graph_settings.get("activations") != "int8"
    return "off" if mode == "auto" and not exact else mode


def exact_prefix_cache(device: str, graph_settings: Mapping[str, Any]) -> str:
    """``on`` where a prompt pass computes each position's keys, values and logits the same
    whatever else the pass holds (so reused KV is a fresh run's, bit for bit), else ``off``: so at
    f32, and at bf16 on the AVX-512 VNNI/BF16 class (docs/prefix-caching.md, docs/performance.md);
    the f32 tests check it on every class CI runs on; bf16 on AMX is off (its rows depend on the
    pass). A u8 KV cache's per-block scales depend on how a block filled."""
    precision = graph_settings["inference_precision"]
    if device_type(device) != "CPU" or graph_settings["kv_cache_precision"] == "u8":
        return "off"
    if precision == "f32" or (precision == "bf16" and CpuInfo.read().class_name == "AVX-512 VNNI/BF16"):
        return "on"
    return "off"
