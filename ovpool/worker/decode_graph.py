"""The decode graph: the paged graph with its token dimensions fixed to one token of one sequence.

OpenVINO's CPU plugin runs a graph whose shapes are all static without its per-node dynamic-shape
work, splits in place, and fuses chains of element-wise ops into JIT "snippets" (which it does not
do for dynamic shapes here): a SmolLM2 decode step at a 512-token context takes 10-14% less time on
it than the same step on the dynamic paged graph (A/B alternating in one process). Only the
KV-block inputs stay dynamic, and both graphs read and write the same blocks
(ovpool.worker.batch.PagedRunner sends each one-token pass of one sequence here), so a sequence
prefills on the dynamic graph and decodes on this one.

The price is a second compiled model with its own copy of the weights (SmolLM2: ~+225 MiB RSS) and
a second compile, on a thread of its own once the dynamic graph is compiled (beside that compile it
delayed an uncached start's first token by ~0.8 s on 2 cores); decode steps move to it when it is
ready (no request waits for it; a warm-up does, so that it sets the decode graph up too). The
``decode_graph`` setting decides; ``auto`` uses it on the CPU when twice the model's file fits in
``MEMORY_SHARE`` of physical memory.
It is compiled, never cached: like every paged graph on OpenVINO 2026.4's CPU plugin it could not
be re-imported (ovpool.worker.loading.reimport_problem).
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import openvino as ov

from ovpool.cache.loader import compile_model
from ovpool.errors import OvpoolError

log = logging.getLogger("ovpool.worker")

# The dynamic paged graph's inputs that one token of one sequence fixes (see ovpool.worker.paged).
ONE_TOKEN = {"input_ids": [1, 1], "position_ids": [1, 1], "past_lens": [1], "subsequence_begins": [2],
             "block_indices_begins": [2], "logits_indices": [1]}
MEMORY_SHARE = 1 / 8


def wanted(choice: str, device: str, model_path: Path) -> bool:
    """Whether the ``decode_graph`` setting (auto, on, off) asks for a decode graph."""
    if choice != "auto":
        return choice == "on"
    if device.split(".")[0] != "CPU":
        return False
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return 2 * model_path.stat().st_size <= memory * MEMORY_SHARE


def one_token(model: ov.Model) -> ov.Model:
    """A copy of the paged graph ``model`` with the token dimensions of ``ONE_TOKEN``."""
    copy = model.clone()
    copy.reshape({port.get_any_name(): ov.PartialShape(ONE_TOKEN[port.get_any_name()])
                  for port in copy.inputs if port.get_any_name() in ONE_TOKEN})
    return copy


def compile_beside(core: ov.Core, model: ov.Model, device: str, config: dict) -> Future:
    """Start compiling the decode graph of the paged graph ``model`` on a thread (compiling releases
    the GIL; ``model`` must not change meanwhile); see ``ready``."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="decode-graph")
    future = pool.submit(_compile, core, model, device, config)
    pool.shutdown(wait=False)
    return future


def ready(pending: Future | None, wait: bool = False) -> ov.CompiledModel | None:
    """The compiled decode graph once its compile has finished (``wait``: wait for it); None while
    it compiles, or if it could not be compiled (the dynamic graph serves every pass then)."""
    if pending is None or not (wait or pending.done()):
        return None
    return pending.result()


def _compile(core: ov.Core, model: ov.Model, device: str, config: dict) -> ov.CompiledModel | None:
    try:
        return compile_model(core, one_token(model), device, config)
    except OvpoolError as exc:  # an optimisation: the dynamic graph runs decode steps too
        log.warning("decode graph not compiled, decode steps stay on the dynamic graph: %s", exc)
        return None
