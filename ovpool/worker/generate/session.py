"""One sequence's KV cache on one InferRequest: feeds the graph's ports (contract 1).

A Session tracks how many positions its cache holds, builds ``input_ids``, ``attention_mask``,
``position_ids``, ``beam_idx`` and ``logits_from`` for each forward pass, and keeps the KV either
in the request's state variables (stateful graphs) or as tensors it feeds back (stateless graphs).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import openvino as ov

from ovpool.errors import InferenceError

_PAST = "past_key_values."
_PRESENT = "present."
# The CPU plugin lays weights out once for passes of 1-6 rows and once for 7 or more: a prefill of
# 8 tokens sets the second up, a pass of 2 tokens the first (a one-token pass may run on a decode
# graph of its own, ovpool.worker.graph.decode), and one decode step the decode graph.
_WARM_UP_PROMPT = 8


class Session:
    """Forward passes of one sequence (batch 1). ``reset()`` empties its cache for reuse. No prefix
    cache: the stateful graph computes a prompt in two passes differently from one."""

    def __init__(self, request: ov.InferRequest):
        self.request = request
        inputs = {port.get_any_name(): port for port in request.model_inputs}
        self._has_beam_idx = "beam_idx" in inputs
        self._past_ports = {name: port for name, port in inputs.items() if name.startswith(_PAST)}
        self._kv: dict[str, ov.Tensor] = {}
        self.past = 0
        self.reset()

    @property
    def stateful(self) -> bool:
        return not self._past_ports

    def reset(self) -> None:
        """Forget every cached position: the next forward pass starts a new sequence."""
        if self.stateful:
            self.request.reset_state()
        else:
            self._kv = {name: _empty_kv(port) for name, port in self._past_ports.items()}
        self.past = 0

    def prepare(self) -> None:
        """Nothing to make: one compiled graph (PagedSession may run a second one)."""

    def forward(self, ids: Sequence[int], logits_from: int) -> np.ndarray:
        """Run ``ids`` after the cached positions; logits [len(ids) - logits_from, vocab].

        The returned array is the request's own output buffer: valid until the next forward pass.
        """
        n = len(ids)
        feeds = {
            "input_ids": np.asarray([ids], dtype=np.int64),
            "attention_mask": np.ones((1, self.past + n), dtype=np.int64),
            "position_ids": np.arange(self.past, self.past + n, dtype=np.int64)[None, :],
            "logits_from": np.asarray([logits_from], dtype=np.int64),
        }
        if self._has_beam_idx:
            feeds["beam_idx"] = np.zeros(1, dtype=np.int32)
        feeds.update(self._kv)
        try:
            # Shared both ways: no copy of the inputs, and no copy of the logits into a result dict.
            self.request.infer(feeds, share_inputs=True, share_outputs=True)
        except RuntimeError as exc:
            raise InferenceError(f"inference failed at {self.past} cached + {n} new tokens: {exc}") from exc
        self.past += n
        if not self.stateful:
            self._keep_present()
        return self.request.get_tensor("logits").data[0]

    def _keep_present(self) -> None:
        # Copy: the plugin may reuse an output buffer for the next pass while it reads the input.
        for name in self._kv:
            out = self.request.get_tensor(_PRESENT + name[len(_PAST):])
            kept = ov.Tensor(out.element_type, out.shape)
            out.copy_to(kept)
            self._kv[name] = kept


def _empty_kv(port: ov.ConstOutput) -> ov.Tensor:
    """A zero-length cache tensor [1, kv_heads, 0, head_dim] for a past_key_values input."""
    shape = port.get_partial_shape()
    dims = [1, shape[1].get_length(), 0, shape[3].get_length()]
    return ov.Tensor(port.get_element_type(), ov.Shape(dims))


def warm_up(session) -> None:
    """One pass of each kernel layout on ``session`` (a Session or a PagedSession), then reset: the
    device's one-time set-up (a fraction of a second per layout, docs/performance.md) is shared by
    every request of the compiled model, so no request pays it."""
    session.prepare()
    session.forward([0] * _WARM_UP_PROMPT, logits_from=_WARM_UP_PROMPT - 1)
    session.forward([0, 0], logits_from=1)
    session.forward([0], logits_from=0)
    session.reset()
