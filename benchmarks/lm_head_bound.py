"""Would an exact greedy shortcut over the output projection pay? For each position of a text:
a cheap pass with a b-bit copy of the projection (symmetric, groups of 32, requantized from the
file's weights) and a proven bound on its error per row (Cauchy-Schwarz: ||x|| * ||W_r - W'_r||),
then how many rows could still beat the best (approximate + bound >= the best row's approximate -
bound): those the exact rows would have to rescore. Exact NumPy reference (ovpool.testing.reference),
so no engine and no CPU-class dependence.

    .venv/bin/python benchmarks/lm_head_bound.py [--model gemma3-270m] [--positions 160] [--bits 4 6]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ovpool.models import resolve_model_path
from ovpool.testing.reference import Reference
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.text.tokenizer import Tokenizer


def requantized(w: np.ndarray, bits: int) -> np.ndarray:
    """``w`` [rows, cols] through symmetric ``bits``-bit codes with a scale per 32 (float32 result)."""
    groups = w.reshape(w.shape[0], -1, 32)
    scale = np.abs(groups).max(-1, keepdims=True) / (2 ** (bits - 1) - 1)
    return (np.rint(groups / np.where(scale == 0, 1, scale)) * scale).reshape(w.shape)


def report(x: np.ndarray, head: np.ndarray, bits: int) -> str:
    exact = x @ head.T
    best = exact.argmax(-1)
    cheap = requantized(head, bits)
    approx = x @ cheap.T
    bound = np.linalg.norm(x, axis=1)[:, None] * np.linalg.norm(head - cheap, axis=1)[None]
    floor = (approx - bound).max(-1, keepdims=True)
    candidates = ((approx + bound) >= floor).sum(-1)
    ranks = (approx > approx[np.arange(len(best)), best][:, None]).sum(-1)
    gaps = np.diff(np.sort(exact, -1)[:, -2:], axis=-1)[:, 0]
    return (f"{bits}-bit pass: rows left to rescore median {np.median(candidates):.0f}, p90 "
            f"{np.percentile(candidates, 90):.0f}, max {candidates.max()} of {head.shape[0]}; its "
            f"argmax is the exact one at {np.mean(ranks == 0):.3f} of positions, the exact one ranks "
            f"<= {ranks.max()}; median bound {np.median(bound):.3g} against a median top-1/top-2 "
            f"gap of {np.median(gaps):.3g}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--positions", type=int, default=160)
    p.add_argument("--bits", type=int, nargs="+", default=[4, 6])
    args = p.parse_args()
    model = GGUFModel.open(resolve_model_path(args.model))
    ids = Tokenizer.from_metadata(model.metadata).encode(
        (Path(__file__).parents[1] / "README.md").read_text(), add_special=False)[:args.positions]
    reference = Reference(model)
    x = reference.hidden(ids)
    for bits in args.bits:
        print(report(x, reference.head(), bits))


if __name__ == "__main__":
    main()
