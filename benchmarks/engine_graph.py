"""Speed of ovpool's graph alone (no tokenizer, no sampling): build, compile, prefill, decode.

    .venv/bin/python benchmarks/engine_graph.py [--model smollm2] [--prompt 512] [--decode 128]
        [--set NAME=VALUE ...] [--config KEY=VALUE ...]

Prints build and compile seconds, time for a prompt-long prefill (logits of the last position
only) and greedy decode tokens/s, with one InferRequest, as the engine drives it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import openvino as ov

from ovpool.settings import Settings, parse_assignments
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.graph.builder import build_model
from ovpool.worker.graph.compile_settings import compile_config
from ovpool.worker.graph.cpu_class import CpuInfo


def feeds(ids: np.ndarray, past: int, stateful: bool) -> dict:
    n = ids.shape[1]
    f = {"input_ids": ids, "attention_mask": np.ones((1, past + n), np.int64),
         "position_ids": np.arange(past, past + n, dtype=np.int64)[None],
         "logits_from": np.array([n - 1], np.int64)}
    if stateful:
        f["beam_idx"] = np.zeros(1, np.int32)
    return f


def run(request: ov.InferRequest, prompt: int, decode: int, vocab: int) -> tuple[float, float]:
    request.reset_state()
    ids = np.random.default_rng(0).integers(0, vocab, (1, prompt))
    start = time.perf_counter()
    logits = request.infer(feeds(ids, 0, True))["logits"]
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for step in range(decode):
        token = np.array([[int(logits[0, -1].argmax())]], np.int64)
        logits = request.infer(feeds(token, prompt + step, True))["logits"]
    return prefill, decode / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--config", action="append", default=[], help="extra compile property")
    args = ap.parse_args()
    settings = Settings.resolve(parse_assignments(args.set))
    model = GGUFModel.open(args.model)
    start = time.perf_counter()
    graph = build_model(model, settings)
    built = time.perf_counter() - start
    core = ov.Core()
    config = compile_config(settings, "CPU", core) | dict(c.split("=", 1) for c in args.config)
    start = time.perf_counter()
    request = core.compile_model(graph, "CPU", config).create_infer_request()
    compiled_s = time.perf_counter() - start
    print(f"cpu: {CpuInfo.read(core).describe()}\nconfig {config}")
    print(f"build {built:.2f} s, compile {compiled_s:.2f} s")
    for _ in range(args.repeat):
        prefill, tps = run(request, args.prompt, args.decode, model.hparams.vocab_size)
        print(f"prefill {args.prompt} tokens {prefill * 1000:.0f} ms, decode {tps:.1f} tokens/s")


if __name__ == "__main__":
    main()
