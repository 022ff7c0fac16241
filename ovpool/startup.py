"""Start-up trims for ovpool's own processes (every ``ovpool`` command: workers, serve, generate).

``import openvino`` ends by importing its model converter, openvino.tools.ovc (with telemetry,
urllib, http and numpy.ma: about 0.1 s here), only to offer ``openvino.convert_model``, which ovpool
never calls. ``defer_openvino_converter()`` makes that one import fail the way openvino's
``__init__`` already tolerates (ImportError) and sets ``openvino.convert_model`` to a function that
imports the converter on its first call, so code that does convert models still works. It acts
once, and only if openvino is not loaded yet; a later ``import openvino.tools.ovc`` loads normally.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

_CONVERTER = "openvino.tools.ovc"


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


def defer_openvino_converter() -> None:
    if "openvino" not in sys.modules and not any(isinstance(f, _DeferConverter) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferConverter())
