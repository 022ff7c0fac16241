"""The OpenVINO side of the paged graph (ovpool.worker.graph.paged): its KV blocks, one pass per Plan.

``PagedRunner`` allocates the KV block tensors (their element type and layout are what the
compiled model asks for) and turns a scheduler Plan into the op's inputs for one forward pass.
``PagedSession`` runs one sequence on it with the stateful Session's interface: teacher-forced
logits and warm-ups on the paged graph (generations run on a Batcher, ovpool.worker.generate.streams).
"""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import openvino as ov

from ovpool.errors import InferenceError
from ovpool.worker.generate.lone_pass import is_lone_step, padded
from ovpool.worker.generate.pass_inputs import PassInputs
from ovpool.worker.generate.plan import Chunk
from ovpool.worker.graph.decode import DecodeGraph

_MIB = 1 << 20
# A single sequence starts with room for this many positions and doubles it as it grows.
_SESSION_POSITIONS = 1024


@dataclass(frozen=True)
class PagedGraph:
    """A compiled paged graph as its owner (ovpool.worker.graphs) hands it to a Batcher, which runs
    on it but neither loads nor closes it; ``outcome``, ``entry``, ``seconds``: how it came."""

    compiled: ov.CompiledModel
    decode: DecodeGraph | None
    identity: bytes  # the model, device and graph settings: see Batcher's block addresses
    outcome: str
    entry: str | None
    seconds: float


class PagedRunner:
    """One InferRequest over ``compiled`` with ``kv_cache_mb`` MiB of KV blocks (at least one),
    or exactly ``num_blocks`` blocks, and one scratch block after them (block ``num_blocks``: a
    lone pass's padding, ovpool.worker.generate.lone_pass); lone steps, padded, run on the
    ``decode`` graph (ovpool.worker.graph.decode), once it is ready, on the same blocks."""

    def __init__(self, compiled: ov.CompiledModel, kv_cache_mb: int = 0, num_blocks: int = 0,
                 decode: DecodeGraph | None = None):
        self.compiled, self.decode = compiled, decode
        # [the dynamic graph's, then the decode graph's once ready]: all see the same KV blocks.
        self.requests = [compiled.create_infer_request()]
        self._pass_inputs: dict[int, PassInputs] = {}  # by id(request): see _inputs
        self._logits_port = next(i for i, p in enumerate(compiled.outputs) if "logits" in p.get_names())
        caches = [p for p in compiled.inputs if "_cache." in p.get_any_name()]
        self._layout = {p.get_any_name(): (p.get_element_type(),
                                           [d.get_length() for d in list(p.get_partial_shape())[1:]])
                        for p in caches}
        # u8 caches keep scales inside the block, so the value cache's third dim is the block size.
        self.block_size = self._layout["value_cache.0"][1][1]
        self.block_bytes = sum(int(np.prod(dims)) * kind.size for kind, dims in self._layout.values())
        self._caches: dict[str, ov.Tensor] = {}
        self.num_blocks = 0
        self._written = 0  # blocks [0, this) may hold data: a grow copies only those (see grow)
        self.grow(num_blocks or max(1, kv_cache_mb * _MIB // self.block_bytes))

    @property
    def kv_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    def grow(self, num_blocks: int) -> None:
        """Hold ``num_blocks`` blocks (and the scratch block); those already there keep their contents."""
        if num_blocks <= self.num_blocks:
            return  # a copy would write every page of the blocks held (SmolLM2's 256 MiB of zeros)
        held = num_blocks + 1  # the scratch block's contents are never read: not copied
        # Zeroed, as GenAI does: vector kernels multiply the unused tail of a block by zero, and
        # NaN garbage in fresh memory would survive that (NaN * 0 = NaN). See zero_pages: they
        # take no memory until a block is written.
        sizes = {name: held * int(np.prod(dims)) * kind.size
                 for name, (kind, dims) in self._layout.items()}
        memory, start = zero_pages(sum(-(-n // 64) * 64 for n in sizes.values())), 0
        self._memory = memory  # the tensors share it: kept alive here
        self._block_views = {}  # name -> its bytes as [blocks held, bytes per block] (read_block)
        for name, (kind, dims) in self._layout.items():
            self._block_views[name] = memory[start:start + sizes[name]].reshape(held, -1)
            tensor = ov.Tensor(memory[start:start + sizes[name]], ov.Shape([held, *dims]), kind)
            start += -(-sizes[name] // 64) * 64  # 64-byte aligned, as OpenVINO allocates
            if name in self._caches:  # the rest are zero pages: copying them would write them all
                tensor.data[:self._written] = self._caches[name].data[:self._written]
            self._caches[name] = tensor
            for request in self.requests:
                request.set_tensor(name, tensor)
        self.num_blocks = num_blocks

    def read_block(self, block: int) -> bytes:
        """Block ``block`` of every layer's key and value cache, as bytes (a KV tier's copy)."""
        return b"".join(view[block].tobytes() for view in self._block_views.values())

    def write_block(self, block: int, data: bytes) -> None:
        """Set block ``block`` of every cache from ``read_block``'s bytes (``block_bytes`` of them)."""
        source, start = np.frombuffer(data, np.uint8), 0
        self._written = max(self._written, block + 1)
        for view in self._block_views.values():
            view[block] = source[start:start + view.shape[1]]
            start += view.shape[1]

    def forward(self, chunks: Sequence[Chunk], rows: Sequence[int] | None = None,
                during: Callable[[], None] | None = None) -> np.ndarray:
        """Run every chunk in one pass; logits [sampled chunks, vocab] in chunk order, or of the
        token ``rows`` (indices into the chunks' concatenated tokens) if given. ``during`` runs
        on this thread while the pass runs on the device's (the structured-output masks).

        The array is the request's output buffer: valid until the next forward pass.
        """
        self._written = max([self._written, *(max(c.blocks, default=-1) + 1 for c in chunks)])
        lone = is_lone_step(chunks, rows)
        request = (lone and self._decode_request()) or self.requests[0]
        if lone:  # on either graph: the decode graph's shapes are the padded pass's
            chunks, rows = padded(chunks, self.num_blocks)
        try:
            self._inputs(request).set(feeds(chunks, rows))
            if during is None:
                request.infer(share_outputs=True)  # the logits not copied
            else:
                request.start_async()
                try:
                    during()
                finally:
                    request.wait()
        except RuntimeError as exc:
            raise InferenceError(f"inference failed ({len(chunks)} sequences): {exc}") from exc
        logits = request.get_output_tensor(self._logits_port).data[0]
        return logits[:1] if lone else logits

    def _inputs(self, request: ov.InferRequest) -> PassInputs:
        """``request``'s input tensors, kept between passes (ovpool.worker.generate.pass_inputs)."""
        held = self._pass_inputs.get(id(request))  # held keeps request alive: its id is its own
        if held is None:  # its first pass
            held = self._pass_inputs[id(request)] = PassInputs(request)
        return held

    def _decode_request(self) -> ov.InferRequest | None:
        """The decode graph's request, made once the graph is ready; None until then."""
        if len(self.requests) == 1 and self.decode is not None:
            compiled = self.decode.ready()
            if compiled is None:
                self.decode.count_pass()
                return None
            self.requests.append(self.request_on(compiled))
        return self.requests[1] if len(self.requests) > 1 else None

    def request_on(self, compiled: ov.CompiledModel) -> ov.InferRequest:
        """A new request of ``compiled`` (this graph or a copy of it) on these KV blocks, until
        ``grow`` replaces them; what runs on it leaves the runner's own requests' inputs alone."""
        request = compiled.create_infer_request()
        for name, tensor in self._caches.items():
            request.set_tensor(name, tensor)
        return request


class PagedSession:
    """One sequence on the paged graph, with ovpool.worker.generate.session.Session's interface
    (``forward``, ``reset``, ``past``). Its KV blocks double whenever the sequence outgrows them."""

    def __init__(self, compiled: ov.CompiledModel, decode: DecodeGraph | None = None):
        self.runner = PagedRunner(compiled, num_blocks=1, decode=decode)
        self.runner.grow(-(-_SESSION_POSITIONS // self.runner.block_size))
        self.reset()

    def reset(self) -> None:
        self.past = 0

    def prepare(self) -> None:
        """Make the decode graph now if there is one, so that a warm-up sets it up too."""
        if self.runner.decode is not None:
            self.runner.decode.ready(wait=True)

    def forward(self, ids: Sequence[int], logits_from: int) -> np.ndarray:
        """Run ``ids`` after the cached positions; logits [len(ids) - logits_from, vocab]."""
        n = len(ids)
        blocks = -(-(self.past + n) // self.runner.block_size)
        if blocks > self.runner.num_blocks:
            self.runner.grow(max(blocks, 2 * self.runner.num_blocks))
        chunk = Chunk(seq_id="", start=self.past, tokens=list(ids), blocks=list(range(blocks)), sample=True)
        logits = self.runner.forward([chunk], rows=range(logits_from, n))
        self.past += n
        return logits


def zero_pages(nbytes: int) -> np.ndarray:
    """``nbytes`` of zeroed memory that takes none until written, 4 KiB at a time: an anonymous
    mapping with huge pages off. np.zeros's memory did not: NumPy advises huge pages for arrays of
    4 MiB and more, so writing one KV block faulted in 2 MiB around it, in every layer's tensor
    (docs/performance.md)."""
    memory = mmap.mmap(-1, max(nbytes, 1))
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux; elsewhere the system's default pages
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, np.uint8, nbytes)


def feeds(chunks: Sequence[Chunk], rows: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """The paged graph's per-pass inputs for ``chunks`` (see ovpool.worker.graph.paged); logits for
    ``rows`` of the concatenated tokens, by default the last token of each sampled chunk. Built
    from Python lists: a decode step's arrays hold a few numbers, where each NumPy call costs more
    than the numbers."""
    lengths = [len(c.tokens) for c in chunks]
    ends = list(itertools.accumulate(lengths))
    if rows is None:
        rows = [end - 1 for c, end in zip(chunks, ends, strict=True) if c.sample]
    positions = [p for c in chunks for p in range(c.start, c.start + len(c.tokens))]
    return {
        "input_ids": np.array([[t for c in chunks for t in c.tokens]], np.int64),
        "position_ids": np.array([positions], np.int64),
        "past_lens": np.array([c.start for c in chunks], np.int32),
        "subsequence_begins": np.array([0, *ends], np.int32),
        "block_indices": np.array([b for c in chunks for b in c.blocks], np.int32),
        "block_indices_begins": np.array([0, *itertools.accumulate(len(c.blocks) for c in chunks)], np.int32),
        "max_context_len": np.array(max(c.start + n for c, n in zip(chunks, lengths, strict=True)), np.int32),
        "logits_indices": np.array(rows, np.int64),
    }
