"""Benchmarks run as on a CPU with fewer instructions: ``--isa AVX2`` on an AVX-512 host.

oneDNN, which runs OpenVINO's CPU MatMuls (~80% of a SmolLM2 decode step), honours
``ONEDNN_MAX_CPU_ISA`` and then JITs only AVX2 code, like the CPU plugin's own kernels that ask
oneDNN what the CPU may use (the element-wise "Subgraph" snippets); others (RMS norm,
PagedAttention) read CPUID themselves and stay AVX-512. The plugin's default precision also
comes from CPUID, so it still says bf16, which AVX2 kernels cannot run: both sides are pinned to
what an AVX2 host runs by default, f32 without int8 activations. The figures are those of AVX2
MatMul kernels on this host's memory and caches, not of an AVX2 host: label them so.
"""

from __future__ import annotations

from ovpool.settings import set_variable, variable

VARIABLE = "ONEDNN_MAX_CPU_ISA"
CHOICES = ("AVX2",)


def emulate(isa: str | None) -> None:
    """Limit this process and its children to ``isa`` (None: the CPU's own)."""
    if isa is None:
        return
    if isa not in CHOICES:
        raise SystemExit(f"--isa {isa}: only {', '.join(CHOICES)} can be emulated")
    set_variable(VARIABLE, isa)
    set_variable("OVPOOL_INFERENCE_PRECISION", "f32")  # ovpool at f32 turns int8 activations off


def peer_properties() -> dict:
    """OpenVINO properties GenAI needs to run as on the emulated CPU (none without emulation)."""
    if not variable(VARIABLE):
        return {}
    return {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}


def describe(cpu: str) -> str:
    """The benchmark's CPU line, saying when its kernels were limited."""
    if not variable(VARIABLE):
        return cpu
    return f"{cpu}, kernels limited to {variable(VARIABLE)} ({VARIABLE}; see ovpool/bench/isa.py)"
