"""ovpool's commands import OpenVINO without its model converter, and openvino.convert_model still
works for code that calls it (it imports the converter then)."""

import subprocess
import sys

import openvino

from ovpool.startup import _DeferConverter, defer_openvino_converter

_CHILD = """
import sys
from ovpool.startup import defer_openvino_converter
defer_openvino_converter()
import openvino as ov
print("loaded at import:", "openvino.tools.ovc" in sys.modules)
try:
    ov.convert_model("/nonexistent/model.onnx")
except Exception as exc:
    print("error:", exc)
print("loaded after a call:", "openvino.tools.ovc" in sys.modules)
"""


def test_the_converter_loads_on_the_first_convert_model_call_not_at_import():
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True).stdout
    assert "loaded at import: False" in out
    assert "must be existing file/directory" in out  # the converter's own check ran
    assert "loaded after a call: True" in out


def test_an_already_imported_openvino_is_left_alone():
    assert openvino.__name__ in sys.modules
    defer_openvino_converter()
    assert not any(isinstance(f, _DeferConverter) for f in sys.meta_path)
