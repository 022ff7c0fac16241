"""ovpool: GGUF language models on OpenVINO devices, served by a pool of worker processes."""

from ovpool import errors
from ovpool.errors import OvpoolError

__all__ = ["OvpoolError", "errors"]
