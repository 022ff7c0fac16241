"""The decode graph: the paged graph with its token dimensions fixed to a lone decode step's padded
pass (the step's token and the dummy sequence's, ovpool.worker.generate.lone_pass), so that a
request's logits are the same bits alone, on either graph, as in a batched pass.

OpenVINO's CPU plugin runs a graph whose shapes are all static without its per-node dynamic-shape
work, splits in place, and fuses chains of element-wise ops into JIT "snippets" (which it does not
do for dynamic shapes here), so a decode step is faster on it than on the dynamic paged graph,
at bf16 without snippets too (cpu_class.Defaults.decode_snippets), with the same tokens: it pays
for its memory (docs/performance.md, "ovpool/worker/graph/decode.py"). Only the
KV-block inputs stay dynamic, and both graphs read and write the same blocks
(ovpool.worker.generate.batch.PagedRunner sends each lone step here), so a sequence
prefills on the dynamic graph and decodes on this one.

The price is a second compiled model (it shares the dynamic graph's constants, but the CPU plugin's
packed weights belong to one compiled model, ``m_socketWeights``, so it lays the weights out for
each; an ``If`` would share them inside one model, but copies its inputs, the KV blocks among
them, into its body at every pass: docs/performance.md, "what the decode graph holds") and a
second compile, so it is made on demand, on a thread of its own: by a warm-up (a
worker's, once idle; ``Engine.warm_up``), which waits for it, or once an engine has run
``START_AFTER`` lone steps without it, when it is likely to pay for itself. A process that
generates a few tokens never compiles it (and never waits at exit for a compile it did not need).
Until it is ready, lone steps run on the dynamic graph. The ``decode_graph`` setting decides
whether there is one; ``auto`` means on the CPU for models of up to ``MAX_WEIGHTS`` of weights, if
twice those fit in ``MEMORY_SHARE`` of physical memory, and where the CPU class's faster step pays
for its memory (``pays``: not on AMX at f32, ovpool.worker.graph.cpu_class). It is compiled, never
cached: like every paged graph on OpenVINO 2026.4's CPU plugin it could not be re-imported
(ovpool.worker.graph.loading.reimport_problem).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import openvino as ov

from ovpool.cache.loader import compile_model
from ovpool.devices import device_type
from ovpool.errors import OvpoolError
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.graph import cpu_class

log = logging.getLogger("ovpool.worker")

# The dynamic paged graph's inputs that a padded lone step fixes: two sequences of one token, a
# logits row each (see ovpool.worker.graph.paged). A one-row graph ran the compressed MatMuls' and
# the head's one-row kernels, whose last bits differ from a batched pass's (docs/performance.md).
LONE_STEP = {"input_ids": [1, 2], "position_ids": [1, 2], "past_lens": [2], "subsequence_begins": [3],
             "block_indices_begins": [3], "logits_indices": [2]}
MEMORY_SHARE = 1 / 8
# Past this many bytes of weights the decode graph's second layout of them costs more memory than
# its faster step is worth (measured at 135M, 1.1B and 3B: docs/performance.md, decode.py).
MAX_WEIGHTS = 512 << 20
# A process that has run this many one-token passes is likely to run many more; one that generates
# a few hundred tokens once gains little either way (docs/performance.md, decode.py).
START_AFTER = 128


def wanted(choice: str, device: str, model: GGUFModel, paying: bool = True) -> bool:
    """Whether the ``decode_graph`` setting (auto, on, off) asks for a decode graph for ``model``
    (``paying``: see ``pays``)."""
    return resolve(choice, device, weight_bytes(model), physical_memory(), paying)


def resolve(choice: str, device: str, weights: int, memory: int, paying: bool = True) -> bool:
    """``decode_graph=choice`` for a model of ``weights`` bytes on ``device``, on a host of
    ``memory`` bytes: auto is on on the CPU up to ``largest_weights(memory)``, where the CPU
    class's faster step pays for it (``paying``, see ``pays``)."""
    if choice != "auto":
        return choice == "on"
    return paying and device_type(device) == "CPU" and weights <= largest_weights(memory)


def pays(device: str, precision: str, core: ov.Core) -> bool:
    """Whether this host's CPU class gains enough from a decode graph at the resolved inference
    ``precision`` to hold its memory (cpu_class.Defaults.decode_graph); True off the CPU."""
    if device_type(device) != "CPU":
        return True
    return cpu_class.choose(cpu_class.CpuInfo.read(core), precision).decode_graph


def largest_weights(memory: int) -> float:
    """The most weight bytes ``decode_graph=auto`` makes a decode graph for: ``MAX_WEIGHTS``, and
    twice the weights within ``MEMORY_SHARE`` of the host's ``memory``."""
    return min(MAX_WEIGHTS, memory * MEMORY_SHARE / 2)


def weight_bytes(model: GGUFModel) -> int:
    """Bytes of ``model``'s tensors, from its header (no weight read)."""
    return sum(info.nbytes for info in model.tensors.values())


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def auto_text(device: str, paying: bool = True) -> str:
    """What ``decode_graph=auto`` means on ``device`` (``paying``: see ``pays``), for ``ovpool settings``."""
    if device_type(device) != "CPU":
        return "off"
    if not paying:
        return "off on this CPU class at this precision (AMX at f32: its faster step is not worth its memory)"
    return f"on for models of up to {largest_weights(physical_memory()) / 2**20:,.0f} MiB of weights"


def lone_step(model: ov.Model) -> ov.Model:
    """The paged graph ``model`` with the token dimensions of ``LONE_STEP`` (reshaped in place)."""
    model.reshape({port.get_any_name(): ov.PartialShape(LONE_STEP[port.get_any_name()])
                   for port in model.inputs if port.get_any_name() in LONE_STEP})
    return model


class DecodeGraph:
    """A decode graph made on demand: ``build`` (which returns the paged graph's model, to be
    reshaped) and the compile run on a thread once ``start``ed; ``ready`` hands it out."""

    def __init__(self, build: Callable[[], ov.Model], core: ov.Core, device: str, config: dict):
        self._make = lambda: compile_model(core, lone_step(build()), device, config)
        self._future: Future | None = None
        self._lock = threading.Lock()
        self.passes = 0  # lone steps run without it

    @property
    def started(self) -> bool:
        return self._future is not None

    def start(self) -> None:
        """Begin building and compiling it (once)."""
        with self._lock:
            if self._future is None:
                pool = ThreadPoolExecutor(1, thread_name_prefix="decode-graph")
                self._future = pool.submit(self._compile)
                pool.shutdown(wait=False)

    def ready(self, wait: bool = False) -> ov.CompiledModel | None:
        """The compiled graph once ready (``wait``: start it and wait); None before that, or if
        it could not be made (the dynamic graph serves every pass then)."""
        if wait:
            self.start()
        elif self._future is None or not self._future.done():
            return None
        return self._future.result()

    def count_pass(self) -> None:
        """One more one-token pass ran without it: start it after ``START_AFTER`` of them."""
        self.passes += 1
        if self.passes >= START_AFTER:
            self.start()

    def _compile(self) -> ov.CompiledModel | None:
        try:
            return self._make()
        except OvpoolError as exc:  # an optimisation: the dynamic graph runs decode steps too
            log.warning("decode graph not compiled, decode steps stay on the dynamic graph: %s", exc)
            return None
