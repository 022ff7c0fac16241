"""A stateful graph's first pass, run on the thread that imported it from the cache (see
ovpool.cache.prefetch), before any request needs it.

The CPU plugin lays each weight matrix out for its kernels at the first pass of a shape class
(passes of 1-6 rows share one here, 7+ rows another); a graph imported from the cache pays it in its
first request (4-bit weights: oneDNN's reference int4 reorder, more CPU than the import; measured in
docs/performance.md, "Start on a cache hit"). Every request needs the 1-6 class for its decode
steps, a short prompt for its prefill too (a chat prompt's is 7+ rows). So one pass of one token
sets it up, on a fresh InferRequest whose state is thrown away (its KV never meets a request's) and
whose result is unused: the kernels a shape selects do not depend on earlier passes, so no token
changes. Only this module knows the stateful graph's ports (ovpool.worker.graph.builder.port_spec);
a graph with any other input is left alone. It only moves CPU time off the first request's path,
so it runs only where a core is free for it (``for_warm_up``: more than ``MIN_CORES``). Imports only
numpy and openvino: a command calls ``for_warm_up`` before the engine's modules load.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import openvino as ov

# At most this many cores, a start gains nothing from the early pass: its CPU time is the same,
# and no core is idle for it to run on (cache_startup.py, paired, AVX-512 VNNI/BF16, 2 cores).
MIN_CORES = 2
_ONE_TOKEN = {"input_ids": np.zeros((1, 1), np.int64), "attention_mask": np.ones((1, 1), np.int64),
              "position_ids": np.zeros((1, 1), np.int64), "beam_idx": np.zeros(1, np.int32),
              "logits_from": np.zeros(1, np.int64)}


def one_token_pass(compiled: ov.CompiledModel) -> bool:
    """One pass of one token at position 0 on a new InferRequest of ``compiled``; False (nothing
    run) if its inputs are not the stateful graph's."""
    names = [port.get_any_name() for port in compiled.inputs]
    if not names or not set(names) <= set(_ONE_TOKEN):
        return False
    compiled.create_infer_request().infer({name: _ONE_TOKEN[name] for name in names})
    return True


def for_warm_up(warm_up: str, cores: int | None = None) -> Callable[[ov.CompiledModel], bool] | None:
    """The first pass an early import runs for an engine of setting ``warm_up`` on ``cores``
    usable cores (default: this process's): none with ``off``, which leaves every set-up to the
    first requests, and none on 2 cores or fewer, where the main thread and the import keep both
    busy, so the pass only moves CPU time (measured neutral there: docs/performance.md)."""
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    return None if warm_up == "off" or cores <= MIN_CORES else one_token_pass
