"""ovpool: GGUF language models on OpenVINO devices, served by a pool of worker processes."""

from ovpool import errors
from ovpool.errors import OvpoolError

__all__ = ["AsyncClient", "Client", "Engine", "OvpoolError", "errors"]

# Heavy classes load on first use, so `import ovpool` (CLI startup, clients) stays light.
_LAZY = {"Engine": "ovpool.worker.engine", "Client": "ovpool.client",
         "AsyncClient": "ovpool.async_client"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ovpool' has no attribute {name!r}")
