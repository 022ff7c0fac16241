"""``--isa AVX2``: both sides of a GenAI benchmark run as an AVX2 host does by default."""

from __future__ import annotations

import pytest

from ovpool.bench import isa
from ovpool.settings import Settings


def test_an_avx2_emulation_pins_both_sides_to_f32_without_int8_activations(monkeypatch):
    for name in (isa.VARIABLE, "OVPOOL_INFERENCE_PRECISION"):
        monkeypatch.setenv(name, "")  # so that monkeypatch restores what was there before
        monkeypatch.delenv(name)  # (emulate writes os.environ itself)
    assert isa.peer_properties() == {} and isa.describe("cpu") == "cpu"
    isa.emulate("AVX2")
    assert isa.peer_properties() == {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
    assert Settings.coerce(None).inference_precision == "f32"
    assert "kernels limited to AVX2" in isa.describe("cpu")


def test_only_known_instruction_sets_can_be_emulated():
    with pytest.raises(SystemExit, match="only AVX2"):
        isa.emulate("SSE4")
