"""ovpool's commands import OpenVINO without its model converter and gguf with its constants only;
openvino.convert_model and the rest of gguf still work for code that uses them (they load then)."""

import os
import subprocess
import sys

import gguf
import openvino

from ovpool.startup import _DeferConverter, _DeferGGUF, defer_heavy_imports

_CHILD = """
import sys
from ovpool.startup import defer_heavy_imports
defer_heavy_imports()
import openvino as ov
print("loaded at import:", "openvino.tools.ovc" in sys.modules)
try:
    ov.convert_model("/nonexistent/model.onnx")
except Exception as exc:
    print("error:", exc)
print("loaded after a call:", "openvino.tools.ovc" in sys.modules)
"""

_GGUF_CHILD = """
import sys
from ovpool.startup import defer_heavy_imports
defer_heavy_imports()
from gguf import GGMLQuantizationType, GGML_QUANT_SIZES
import gguf
print("constants:", GGML_QUANT_SIZES[GGMLQuantizationType.Q4_0])
print("reader loaded:", "gguf.gguf_reader" in sys.modules, "yaml" in sys.modules)
from gguf import GGUFWriter
print("writer:", GGUFWriter.__module__, "reader:", gguf.GGUFReader.__module__)
try:
    gguf.no_such_name
except AttributeError as exc:
    print("missing:", exc)
"""


def test_the_converter_loads_on_the_first_convert_model_call_not_at_import():
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True).stdout
    assert "loaded at import: False" in out
    assert "must be existing file/directory" in out  # the converter's own check ran
    assert "loaded after a call: True" in out


def test_gguf_loads_its_constants_first_and_the_rest_on_first_use():
    out = subprocess.run([sys.executable, "-c", _GGUF_CHILD], capture_output=True, text=True,
                         check=True).stdout
    assert "constants: (32, 18)" in out
    assert "reader loaded: False False" in out
    assert "writer: gguf.gguf_writer reader: gguf.gguf_reader" in out
    assert "missing: module 'gguf' has no attribute 'no_such_name'" in out


def test_already_imported_packages_are_left_alone():
    assert {openvino.__name__, gguf.__name__} <= set(sys.modules)
    defer_heavy_imports()
    assert not any(isinstance(f, _DeferConverter | _DeferGGUF) for f in sys.meta_path)


def test_the_commands_help_loads_neither_openvino_nor_gguf():
    code = ("import runpy, sys\nsys.argv = ['ovpool', '--help']\ntry:\n"
            "    runpy.run_module('ovpool', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('openvino', 'gguf') if m in sys.modules), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Usage: ovpool" in done.stdout
    assert done.stderr.strip().splitlines()[-1] == "[]"


_BLAS_CHILD = """
import os
from ovpool.startup import defer_heavy_imports
defer_heavy_imports()
import numpy
print("threads:", os.environ.get("OPENBLAS_NUM_THREADS"))
"""


def test_numpy_starts_one_blas_thread_unless_the_environment_says_otherwise():
    def threads(env: dict[str, str]) -> str:
        done = subprocess.run([sys.executable, "-c", _BLAS_CHILD], capture_output=True, text=True,
                              check=True, env=env)
        return done.stdout.strip()

    bare = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert threads(bare) == "threads: 1"
    assert threads({**bare, "OPENBLAS_NUM_THREADS": "3"}) == "threads: 3"
