"""What a CPU offers, and the graph defaults ovpool picks for each class of CPU (a pure choice).

The CPU plugin's fast paths depend on the instruction set (OpenVINO 2026.4's source and what was
measured): bf16 compute is its default where ``avx512_bf16`` or AMX exist (``OPTIMIZATION_CAPABILITIES``
lists ``BF16``), and it quantizes the activations of a compressed MatMul to int8 per group of 32
("dynamic quantization") where ``avx512_vnni`` or ``avx_vnni`` exist, at any precision but f32 once
ovpool asks for exactness, and only for integer zero points (``dnnl_fullyconnected_primitive.cpp``,
``useDynamicQuantizationImpl``). Measured on the AVX-512 VNNI/BF16 class (2-core AMD EPYC, OpenVINO
2026.4.1, SmolLM2 Q4_1 at bf16, ``benchmarks/engine_vs_genai.py`` and one-process A/B passes):

* Each row of that int8 path gives the same result whatever else is in the pass (1 to 300 rows,
  bit-identical), which makes a request's tokens the same batched or alone. The other bf16 kernels
  do not (a float zero point's row differs by up to 0.008 between 1, 2-4 and 6+ rows; the static
  decode graph's fused element-wise "snippets" round differently from the dynamic graph's nodes).
  So on this class Q4_1/Q4_K's exact minimum goes in as a rounded u4 zero point plus its exact
  remainder (``zero_points=integer``, ovpool.worker.gguf.quants.integer_zero), Q6_K's 16-weight
  groups get activation groups of 16, and the decode graph runs without snippets (same CPU time).
  The integer form is also faster than the float zero point it replaces (decode step 17.7 vs 19.1
  CPU ms with 4-bit codes, batch of 8 48 vs 53), at the same top-1 agreement with the f32 reference
  (93-94% at bf16, either form; 100% at f32).
* Q6_K's 16-weight groups would set the int8 activation group of every MatMul to 16 (see
  ``activation_group``), so on this class Q6_K is requantized to 8-bit codes in groups of 32
  (``kquant_requant=q6_k_q8_sym32``, lossy; exact f32 keeps Q6_K as it is). gemma3-270m (Q6_K
  in 9 of its 18 ffn_down tensors), decode steps A/B in one process on the 2 shared cores: 1.08x
  less CPU per step (its output projection 1.22x: activation groups of 32), teacher-forced top-1
  agreement with the f32 graph over 6,000 positions 0.927 instead of 0.943 (llama.cpp on the same
  file and positions: 0.912; benchmarks/settings_ab.py).
* 4-bit codes stored a byte each (``q4_storage=i8``) measured the same per step at 135M and 0.67x
  decode at 1.1B (twice the bytes read per token), for twice the weight memory: i4 on every class.
  (On AVX2 a byte per code once set its kernels up ~3x faster and decoded the same; the warm-up pays
  that set-up while a worker is idle.)

Not measured here: AVX2 and AMX hosts. AVX2 (and AVX-512 without VNNI) runs f32 with no int8 path,
where the float zero point is exact and was as fast as an integer one (ovpool.worker.gguf.quants);
AMX gets the VNNI/BF16 choice, which its int8 path (``avx512_vnni`` is part of every AMX CPU) takes
by the plugin's source, unverified for row-independence there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# The ISA flags (as /proc/cpuinfo names them) that change what the CPU plugin runs.
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_int8", "amx_bf16", "amx_fp16")


@dataclass(frozen=True)
class CpuInfo:
    """A CPU's model name, its ISA flags (those in ISA_FLAGS) and OpenVINO's OPTIMIZATION_CAPABILITIES."""

    model: str
    flags: frozenset[str]
    capabilities: frozenset[str] = frozenset()

    @classmethod
    def read(cls, core=None, cpuinfo: str | Path = "/proc/cpuinfo") -> CpuInfo:
        """This host's CPU (``core``: an openvino.Core for the capabilities; None leaves them out)."""
        model, flags = "unknown CPU", set()
        try:
            for line in Path(cpuinfo).read_text().splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown CPU":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
        except OSError:
            pass  # not Linux: the class then rests on the capabilities alone
        caps = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES") if core is not None else ()
        return cls(model, frozenset(flags & set(ISA_FLAGS)), frozenset(caps))

    @property
    def vnni(self) -> bool:
        """Whether the CPU plugin can run compressed MatMuls on int8 activations."""
        return bool(self.flags & {"avx512_vnni", "avx_vnni"})

    @property
    def class_name(self) -> str:
        if "amx_tile" in self.flags:
            return "AMX"
        if "avx512f" in self.flags:
            bf16 = "/BF16" if "avx512_bf16" in self.flags else ""
            return "AVX-512" + (" VNNI" if self.vnni else "") + bf16
        if "avx2" in self.flags:
            return "AVX2" + (" VNNI" if self.vnni else "")
        return "other"

    def describe(self) -> str:
        """One line for a benchmark's header: model, class and ISA flags."""
        return f"{self.model} [{self.class_name}: {' '.join(f for f in ISA_FLAGS if f in self.flags) or '-'}]"


@dataclass(frozen=True)
class Defaults:
    """What ``auto`` means for the graph settings that depend on the CPU class."""

    zero_points: str        # Q4_1/Q4_K minimum: "integer" (rounded + exact remainder) or "float"
    q4_storage: str         # "i4" (packed) or "i8" (a byte per code)
    int8_activations: bool  # the plugin's dynamic quantization stays on (off: exact f32)
    decode_snippets: bool   # the static decode graph may fuse element-wise chains
    kquant_requant: str = "none"  # "q6_k_q8_sym32": Q6_K as 8-bit codes in groups of 32


def choose(cpu: CpuInfo, precision: str) -> Defaults:
    """The defaults for ``cpu`` at the resolved inference ``precision`` (f32, bf16 or f16)."""
    exact = precision == "f32"
    int8 = cpu.vnni and not exact
    # Snippets keep f32 between fused ops where the unfused graph rounds each op to bf16/f16, so
    # only at f32 do the decode graph and the dynamic graph compute the same numbers.
    return Defaults(zero_points="integer" if int8 else "float", q4_storage="i4",
                    int8_activations=not exact, decode_snippets=exact,
                    kquant_requant="q6_k_q8_sym32" if int8 else "none")


def activation_group(weight_groups: Iterable[int]) -> int:
    """The int8 activation group for a model whose integer weights come in ``weight_groups``: the
    plugin's 32, or 16 where a weight has 16-weight groups (Q6_K), which the int8 path otherwise
    leaves to the row-dependent bf16 kernels (group 16 costs ~20% of a prefill, so only then)."""
    return 16 if any(0 < g < 32 for g in weight_groups) else 32
