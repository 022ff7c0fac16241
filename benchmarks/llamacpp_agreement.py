"""ovpool's Engine against llama.cpp (llama-cpp-python) on the same GGUF: do they read the model alike?

    .venv/bin/python benchmarks/llamacpp_agreement.py [--model gemma3-270m] [--new-tokens 32]

For each prompt: the greedy continuation of each side (ovpool at f32, llama.cpp at its defaults),
how many of their first tokens agree, and the teacher-forced top-1 agreement of llama.cpp's logits
with ovpool's over the prompt and ovpool's continuation. llama.cpp multiplies quantized weights by
8-bit-quantized activations (and ovpool at f32 does not), so near-ties can go either way.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village at the edge of a great forest,",
    "def fibonacci(n):\n",
    "The three primary colors are",
    "Water boils at a temperature of",
    "In 1969, Neil Armstrong became the first person to",
    "The quick brown fox",
    "Photosynthesis is the process by which plants",
    "My favorite recipe for chocolate chip cookies starts with",
    "The largest planet in our solar system is",
]
EXACT = {"inference_precision": "f32", "kv_cache_precision": "f32"}


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--new-tokens", type=int, default=32)
    args = p.parse_args()
    import llama_cpp

    from ovpool import Engine
    from ovpool.models import resolve_model_path

    path = str(resolve_model_path(args.model))
    llm = llama_cpp.Llama(model_path=path, n_ctx=512, logits_all=True, verbose=False,
                          n_threads=os.cpu_count(), n_threads_batch=os.cpu_count())
    matched = 0
    with Engine(path, settings=EXACT) as engine:
        for text in PROMPTS:
            prompt = engine.tokenize(text)
            ours = engine.complete(prompt, max_tokens=args.new_tokens, ignore_eos=True).token_ids
            llm.reset()
            theirs = []
            for token in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
                theirs.append(token)
                if len(theirs) == args.new_tokens:
                    break
            ids = prompt + ours
            llm.reset()
            llm.eval(ids)
            their_logits = np.asarray(llm.scores[:len(ids)])
            top1 = float((their_logits.argmax(-1) == engine.logits(ids).argmax(-1)).mean())
            same = common_prefix(ours, theirs)
            matched += same >= 8
            print(f"{same:>3}/{args.new_tokens} first tokens equal, teacher-forced top-1 {top1:.3f}: "
                  f"{text!r} -> {engine.tokenizer.decode(ours)!r}")
    print(f"{matched} of {len(PROMPTS)} prompts: the first 8 greedy tokens equal llama.cpp's")


if __name__ == "__main__":
    main()
