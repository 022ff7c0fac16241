"""Start-up trims for ovpool's own processes (every ``ovpool`` command: workers, serve, generate).

``defer_heavy_imports()`` defers two imports that ovpool's start does not use, and keeps numpy's
import from starting a BLAS thread pool; it acts once per package, and only if that package is not
loaded yet:

- ``import openvino`` ends by importing its model converter, openvino.tools.ovc (with telemetry,
  urllib, http and numpy.ma), only to offer ``openvino.convert_model``, which ovpool never calls.
  That one import fails the way openvino's ``__init__`` already tolerates (ImportError), and
  ``openvino.convert_model`` becomes a function that imports the converter on its first call, so
  code that does convert models still works. A later ``import openvino.tools.ovc`` loads normally.
- ``import gguf`` runs the package's ``__init__``, which imports every submodule: reader, writer,
  vocab, metadata (with PyYAML), ..., while ovpool's loading needs only its constants. The package
  then loads with ``gguf.constants`` only, and runs its real ``__init__`` on the first lookup of any
  other name (``gguf.GGUFReader``, ``from gguf import GGUFWriter``); submodules import as usual.
- ``import numpy`` loads OpenBLAS, which starts a thread per core that spins on its own core for a
  while, CPU time a start shares its cores with; ovpool calls no BLAS routine where speed matters.
  So ``OPENBLAS_NUM_THREADS`` is 1 unless the environment sets it (child processes inherit it).

Import hooks, not an import at start: the commands that never load openvino or gguf (broker, api,
status, complete) must not pay for them, and the modules that import them (cache, worker, cli)
stay plain ``import openvino``. What each saves: docs/performance.md, "ovpool/startup.py".
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

from ovpool.settings import set_variable, variable

_CONVERTER = "openvino.tools.ovc"
_GGUF = "gguf"
_BLAS_THREADS = "OPENBLAS_NUM_THREADS"


class _DeferConverter(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname != _CONVERTER:
            return None
        sys.meta_path.remove(self)
        openvino = sys.modules.get("openvino")
        if openvino is None or not getattr(openvino.__spec__, "_initializing", False):
            return None  # asked for by name, not by openvino's own __init__: load it
        openvino.convert_model = convert_model
        raise ModuleNotFoundError(f"{_CONVERTER} is imported on first use (ovpool)", name=_CONVERTER)


def convert_model(*args: Any, **kwargs: Any) -> Any:
    """``openvino.convert_model``, imported on its first call (see the module docstring)."""
    from openvino.tools.ovc import convert_model as convert

    return convert(*args, **kwargs)


class _DeferGGUF(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname != _GGUF:
            return None
        sys.meta_path.remove(self)
        real = importlib.machinery.PathFinder.find_spec(fullname)
        if real is None or real.origin is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, real.origin, loader=_ConstantsFirst(real.loader),
            submodule_search_locations=real.submodule_search_locations)


class _ConstantsFirst(importlib.abc.Loader):
    """Loads the gguf package as ``from .constants import *``; its own ``__init__`` runs on the
    first lookup of a name that is not there."""

    def __init__(self, real: importlib.abc.Loader):
        self.real = real

    def exec_module(self, module: ModuleType) -> None:
        constants = importlib.import_module(f"{_GGUF}.constants")
        module.__dict__.update((k, v) for k, v in vars(constants).items() if not k.startswith("_"))

        def load_the_rest(name: str) -> Any:
            del module.__dict__["__getattr__"]
            exec(self.real.get_code(_GGUF), module.__dict__)
            return getattr(module, name)

        module.__getattr__ = load_the_rest


def defer_heavy_imports() -> None:
    """Install both deferrals and one BLAS thread (see the module docstring)."""
    if "numpy" not in sys.modules and not variable(_BLAS_THREADS):
        set_variable(_BLAS_THREADS, "1")
    for package, finder in (("openvino", _DeferConverter), (_GGUF, _DeferGGUF)):
        if package not in sys.modules and not any(isinstance(f, finder) for f in sys.meta_path):
            sys.meta_path.insert(0, finder())
