"""How close two sets of exact-graph settings come to a float64 forward pass of the model's weights
as the file defines them (no float32 rounding anywhere): for changes that alter logits in the last
bits, which of the two is nearer.

    .venv/bin/python benchmarks/exactness.py --model gemma3-270m --a zero_points=float \
        --b zero_points=offset [--positions 256] [--windows 3]

Teacher-forced logits over ``--windows`` windows of ``--positions`` tokens of this repository's
docs (spread over the text), each side through its own Engine; the float64 pass is
ovpool.testing.reference's in float64, on weights dequantized exactly (scale * q + offset in
float64 from ovpool.worker.gguf.blocks, where gguf.quants rounds to float32). Per side: the largest
and the rms difference from it, top-1 agreement, and the share of positions where b is at least as
close as a (rms over the vocabulary).
"""

from __future__ import annotations

import argparse

import numpy as np
from settings_ab import doc_ids

from ovpool import Engine
from ovpool.settings import parse_assignments
from ovpool.testing.reference import Reference
from ovpool.worker.gguf.blocks import unpack
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.gguf.quants import Packed, unpack_crumbs, unpack_nibbles


def exact(p: Packed) -> np.ndarray:
    """``p``'s weights in float64, each exact (quants.dequantize rounds to float32)."""
    if p.group == 0:
        if p.element == "bf16":
            return (p.codes.view(np.int16).astype(np.int32) << 16).view(np.float32).astype(np.float64)
        return p.codes.astype(np.float64)
    rows, cols = p.shape
    q = unpack_nibbles(p.codes, p.element) if p.element in ("u4", "i4") else \
        unpack_crumbs(p.codes) if p.element == "u2" else p.codes
    w = q.reshape(rows, cols // p.group, p.group) * p.scale.astype(np.float64)[..., None]
    return (w if p.offset is None else w + p.offset.astype(np.float64)[..., None]).reshape(rows, cols)


class Reference64(Reference):
    """The NumPy reference with float64 weights, norms and RoPE tables."""

    rope_dtype = np.float64

    def weight(self, name: str) -> np.ndarray:
        if name not in self._cache:
            info = self.model.tensors[name]
            w = exact(unpack(info.ggml_type, self.model.raw(name), info.shape))
            self._cache[name] = w.reshape(-1) if len(info.shape) == 1 else w
        return self._cache[name]

    def _norm(self, x, name):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.h.rms_eps) * self.weight(name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--a", nargs="*", default=[], metavar="NAME=VALUE")
    p.add_argument("--b", nargs="*", default=[], metavar="NAME=VALUE")
    p.add_argument("--positions", type=int, default=256)
    p.add_argument("--windows", type=int, default=3)
    args = p.parse_args()
    sides = {"a": parse_assignments(args.a), "b": parse_assignments(args.b)}
    logits, windows = {}, []
    for side, settings in sides.items():
        with Engine(args.model, settings=settings, cache_dir="") as engine:
            if not windows:  # once: the docs may change while this runs
                ids = doc_ids(engine, 10 ** 9)
                windows = [ids[i * len(ids) // args.windows:][:args.positions] for i in range(args.windows)]
            logits[side] = np.concatenate([engine.logits(w).astype(np.float64) for w in windows])
    reference = Reference64(GGUFModel.open(args.model))
    ref = np.concatenate([reference.logits(w) for w in windows])
    rms = {}
    for side, settings in sides.items():
        err = logits[side] - ref
        rms[side] = np.sqrt((err ** 2).mean(-1))
        print(f"{side} {settings or '(defaults)'}: max |logit - float64| {np.abs(err).max():.3g}, "
              f"rms {np.sqrt((err ** 2).mean()):.4g}, top-1 agreement "
              f"{(logits[side].argmax(-1) == ref.argmax(-1)).mean():.4f}")
    print(f"{len(ref)} positions; logits bitwise equal a/b: {(logits['a'] == logits['b']).mean():.4f}; "
          f"b at least as close as a at {(rms['b'] <= rms['a']).mean():.3f} of positions")


if __name__ == "__main__":
    main()
