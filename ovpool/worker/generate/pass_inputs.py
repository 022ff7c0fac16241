"""One InferRequest's per-pass input tensors, kept from one pass to the next.

Handing ``InferRequest.infer`` a dict of arrays makes OpenVINO's Python layer wrap each array in a
new Tensor and look its port up by name, every pass: more of a decode step's host time than
building the arrays (docs/performance.md, AMX: the single-stream decode step). A decode step's
inputs keep their shapes from one step to the next (the block table grows every ``block_size``
tokens), so ``PassInputs`` writes a pass's values into the arrays the request already holds and
sets a new tensor only for an input whose shape changed. The request reads its inputs' memory when
a pass starts, so the values are written before ``infer``/``start_async`` and left alone until it ends.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import openvino as ov


class PassInputs:
    """The input tensors of ``request``, by port name: ``set`` before each pass."""

    def __init__(self, request: ov.InferRequest):
        self.request = request
        self._ports = {name: i for i, port in enumerate(request.model_inputs) for name in port.get_names()}
        self._held: dict[str, np.ndarray] = {}  # the memory each set tensor shares

    def set(self, arrays: Mapping[str, np.ndarray]) -> None:
        """The next pass's inputs: each array's values, copied into the request's memory."""
        for name, array in arrays.items():
            held = self._held.get(name)
            if held is not None and held.shape == array.shape and held.dtype == array.dtype:
                held[...] = array
                continue
            held = self._held[name] = np.array(array, copy=True, order="C")  # the request's own
            self.request.set_input_tensor(self._ports[name], ov.Tensor(held, shared_memory=True))
