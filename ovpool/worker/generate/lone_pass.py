"""A lone one-token pass, padded so that its row is computed as in a batched pass, bit for bit.

OpenVINO's CPU plugin computes a pass of one sequence and one token on other kernel paths than a
pass of two or more: the compressed MatMuls' one-row path, and paged attention's loop for fewer
sequences than threads (``exec_loop_bhl``). Their results differ in the last bits (~5e-5 in
SmolLM2's logits at f32 KV, 5e-4 at f16), enough to flip a near-tie, so a request's answer would
depend on what else the worker runs. A lone decode step therefore gets a second one-token sequence
at position 0 of a scratch KV block that the scheduler never hands out, with a logits row of its own
(the output projection has a one-row path too); the caller drops that row (docs/performance.md, AMX).
The decode graph (ovpool.worker.graph.decode) has this padded pass's shapes, so its rows are the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence

from ovpool.worker.generate.plan import Chunk


def is_lone_step(chunks: Sequence[Chunk], rows: Sequence[int] | None) -> bool:
    """Whether the pass holds one token of one sequence and asks for its one logits row."""
    wanted = len(rows) if rows is not None else sum(c.sample for c in chunks)
    return sum(len(c.tokens) for c in chunks) == 1 and wanted == 1


def padded(chunks: Sequence[Chunk], scratch: int) -> tuple[list[Chunk], list[int]]:
    """A lone step's ``chunks`` and logits rows with the dummy sequence on block ``scratch`` after
    them: the real row is the first of the two."""
    real = next(c for c in chunks if c.tokens)
    return [real, Chunk(seq_id="", start=0, tokens=[0], blocks=[scratch], sample=True)], [0, 1]
