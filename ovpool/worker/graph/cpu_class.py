"""What a CPU offers, and the graph defaults ovpool picks for each class of CPU (a pure choice).

The CPU plugin's fast paths depend on the instruction set (OpenVINO 2026.4's source and what was
measured): bf16 compute is its default where ``avx512_bf16`` or AMX exist (``OPTIMIZATION_CAPABILITIES``
lists ``BF16``), and it quantizes the activations of a compressed MatMul to int8 per group of 32
("dynamic quantization") where ``avx512_vnni`` or ``avx_vnni`` exist, at any precision but f32 once
ovpool asks for exactness, and only for integer zero points (``dnnl_fullyconnected_primitive.cpp``,
``useDynamicQuantizationImpl``). The choices per class, and why:

* Every class: ``inference_precision=auto`` is f32 (``precision``), the exact graph's numbers, where
  the plugin would pick bf16. On AMX a compressed MatMul's bf16 rows depend on how many rows share
  the pass (AMX tiles from 8 rows on, other kernels below; with and without int8 activations), so
  a request's tokens changed when it was batched, and no bf16 variant keeps them; at f32 they do.
  f32 also decodes faster there (1.2x per step on SmolLM2) and its answers are the exact graph's;
  its prefill, without AMX tiles, takes 2-3x as long (a 512-token prompt).
  On AVX-512 VNNI/BF16 the bf16 default agreed with the exact graph on 0.954 of positions and
  answered "Hello" with "Hello! I'shine."; f32 (even on AVX2 MatMul kernels) ran as fast there
  (docs/performance.md, "Quality").
* At bf16 (opt-in) on VNNI/BF16: each row of the int8 path gives the same result whatever else is
  in the pass on that class (not on AMX), the other bf16 kernels do not (a float zero point's row,
  the decode graph's fused "snippets"). So Q4_1/Q4_K's exact minimum goes in as a rounded u4 zero
  point plus its exact remainder (``zero_points=integer``, ovpool.worker.gguf.quants.integer_zero),
  and the decode graph runs without snippets.
* At bf16 on VNNI/BF16: Q6_K's 16-weight groups would set the int8 activation group of every
  MatMul to 16 (see ``activation_group``), so Q6_K is requantized to 8-bit codes in groups of 32
  (``kquant_requant=q6_k_q8_sym32``, lossy; exact f32 keeps Q6_K as it is).
* Every class: 4-bit codes stay 4-bit (``q4_storage=i4``): a byte per code reads twice the bytes
  per token for no faster decode.
* Without the int8 path (f32 on every class, AVX2): Q4_1/Q4_K's exact minimum as a float zero
  point. ``zero_points=offset`` (signed codes with no zero point, plus an offset term beside the
  MatMul) took less CPU per decode step at 1.1B Q4_K_M on AMX, but its logits were further from a
  float64 forward pass than the float zero point's on gemma3, and it was no faster on SmolLM2:
  opt-in (docs/performance.md, "Cost against model size").
* AMX at f32: no decode graph (``decode_graph=auto``). Its static copy of the paged graph saved
  little of a decode step's CPU there, for a second layout of the weights (a peak RSS above
  GenAI's with it, below without; docs/performance.md, ovpool/worker/graph/cpu_class.py); prompt
  lookup's passes of several tokens run on the dynamic graph anyway. Not measured at f32 on the
  other classes, which keep it.
* AMX at f32: the plugin's int8 activations (``activations=int8``: integer zero points, the
  head on f32 activations, whose near-ties decide the token) stay opt-in: cheaper at 8/16
  concurrent and in a prefill, but SmolLM2's sanity answers are not the exact graph's ("What is
  the capital of France?": "L'Étoile, la Marseillaise…"), and several positions in one pass
  compute other numbers than a token a pass (so prompt lookup is off by auto with it). A row is
  the same bits whatever other sequences share its pass, on the decode graph as on the dynamic
  graph, and a prompt cut at a block boundary as in one pass (reused prefixes stay exact).
  AVX-512 VNNI without AMX and AVX2 VNNI: not measured, ``auto`` stays f32 exact there
  (docs/performance.md, "Quality").

The measurements behind each choice: docs/performance.md, "ovpool/worker/graph/cpu_class.py".
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

    @property
    def plugin_precision(self) -> str:
        """The compute precision the CPU plugin picks by itself: bf16 where it lists ``BF16``."""
        return "bf16" if "BF16" in self.capabilities else "f32"

    def describe(self) -> str:
        """One line for a benchmark's header: model, class and ISA flags."""
        return f"{self.model} [{self.class_name}: {' '.join(f for f in ISA_FLAGS if f in self.flags) or '-'}]"


_AVX512 = frozenset({"avx2", "avx512f", "avx512_vnni"})
# A CPU of each class, named by its class, for docs/configuration.md's table of what each class's
# ``auto`` resolves to (``ovpool settings --markdown``).
CLASSES = (CpuInfo("AVX2", frozenset({"avx2"}), frozenset({"FP32", "INT8"})),
           CpuInfo("AVX2 VNNI", frozenset({"avx2", "avx_vnni"}), frozenset({"FP32", "INT8"})),
           CpuInfo("AVX-512 VNNI", _AVX512, frozenset({"FP32", "INT8"})),
           CpuInfo("AVX-512 VNNI/BF16", _AVX512 | {"avx512_bf16"}, frozenset({"FP32", "BF16", "INT8"})),
           CpuInfo("AMX", _AVX512 | {"avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"},
                   frozenset({"FP32", "BF16", "INT8"})))


@dataclass(frozen=True)
class Defaults:
    """What ``auto`` means for the graph settings that depend on the CPU class."""

    zero_points: str        # Q4_1/Q4_K minimum: "integer" (rounded + exact remainder) or "float"
    q4_storage: str         # "i4" (packed) or "i8" (a byte per code)
    activations: str        # "int8": the plugin's dynamic quantization on; "float": off
    decode_snippets: bool   # the static decode graph may fuse element-wise chains
    kquant_requant: str = "none"  # "q6_k_q8_sym32": Q6_K as 8-bit codes in groups of 32
    decode_graph: bool = True  # decode_graph=auto may make one (its faster step pays for its memory)


def precision(plugin_default: str) -> str:
    """What ``inference_precision=auto`` means on a CPU whose plugin picks ``plugin_default`` by
    itself: f32 where that is bf16 (AVX-512 BF16, AMX), for the exact, batch-independent numbers
    (see above); anything else as the plugin has it."""
    return "f32" if plugin_default == "bf16" else plugin_default


def choose(cpu: CpuInfo, precision: str, activations: str = "auto") -> Defaults:
    """The defaults for ``cpu`` at the resolved inference ``precision`` (f32, bf16 or f16) and the
    ``activations`` setting (auto, float or int8)."""
    exact = precision == "f32"
    if activations == "auto":
        activations = "int8" if cpu.vnni and not exact else "float"
    int8 = cpu.vnni and activations == "int8"
    # Snippets keep f32 between fused ops where the unfused graph rounds each op to bf16/f16, so
    # only at f32 do the decode graph and the dynamic graph compute the same numbers.
    return Defaults(zero_points="integer" if int8 else "float", q4_storage="i4",
                    activations=activations, decode_snippets=exact,
                    kquant_requant="q6_k_q8_sym32" if int8 and not exact else "none",
                    decode_graph=not (exact and cpu.class_name == "AMX"))


def activation_group(weight_groups: Iterable[int]) -> int:
    """The int8 activation group for a model whose integer weights come in ``weight_groups``: the
    plugin's 32, or 16 where a weight has 16-weight groups (Q6_K), which the int8 path otherwise
    leaves to the row-dependent bf16 kernels (group 16 slows a prefill, so only then)."""
    return 16 if any(0 < g < 32 for g in weight_groups) else 32
