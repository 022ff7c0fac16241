"""The default graph's quality against the exact one, per model, on this CPU class: teacher-forced
agreement, sanity answers through every graph a request can run on, and what each costs in speed.

    .venv/bin/python benchmarks/quality.py [--models smollm2,gemma3-270m] [--llamacpp] \
        [--candidate inference_precision=f32 ...] [--answers] [--speed] [--isa AVX2]

Agreement: top-1 agreement and mean KL(exact || side) of each side's logits with the exact graph's
(f32 compute, f32 KV cache) over the prose in benchmarks/data/quality_prose.txt (written for this
benchmark, in windows of 300 tokens; every side sees the same windows), each window in one pass
and again a token a pass (as decode steps and a prompt's last token run: on AMX a MatMul of a few
rows takes other kernels than one of hundreds, with other numbers), for the default, each
``--candidate`` (comma-separated NAME=VALUE settings) and, with ``--llamacpp``, llama.cpp on the same
GGUF (llama-cpp-python at its defaults, its own 8-bit activations; on AMX without its AMX weight
buffers, which crash there). Answers: greedy chat replies
(a base model's plain "Question: ... Answer:" completions) to obvious questions, through an
engine's paged graph alone, batched with the others, on the decode graph (after warm-up) and on
the stateful SDPA graph, each against the exact graph's reply.
Speed: per side, decode steps (settings_ab.step_times: stepped in turn) and the first token of a
512-token prompt (sides alternating, a different prompt each round so no prefix cache hits).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import openvino as ov
from settings_ab import EXACT, WINDOW, step_times

from ovpool import Engine
from ovpool.bench import isa
from ovpool.sampling_params import SamplingParams
from ovpool.settings import parse_assignments
from ovpool.worker.backend import EngineBackend
from ovpool.worker.events import Finished
from ovpool.worker.generate.batch import PagedSession
from ovpool.worker.graph.cpu_class import CpuInfo

TEXT = Path(__file__).parent / "data" / "quality_prose.txt"
QUESTIONS = ["What is the capital of France?", "Hello", "What is 2+2?",
             "What color is the sky on a clear day?", "How many days are in a week?",
             "Name a fruit that is yellow.", "What is the opposite of hot?",
             "Translate 'thank you' into French."]
ANSWER_TOKENS = 24
PATHS = ("paged alone", "paged batched", "decode graph", "stateful sdpa")


def prose_windows(engine: Engine, positions: int) -> list[list[int]]:
    ids = engine.tokenize(TEXT.read_text(), add_special=False)
    if len(ids) < positions:
        raise SystemExit(f"{TEXT} has {len(ids)} tokens for {engine.name}, fewer than --positions")
    return [ids[i:i + WINDOW] for i in range(0, positions, WINDOW)]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(exact: list[np.ndarray], side: list[np.ndarray]) -> tuple[float, float]:
    """(top-1 agreement, mean KL(exact || side) in nats) over every position of every window."""
    same, kl, n = 0, 0.0, 0
    for e, s in zip(exact, side, strict=True):
        le, ls = log_softmax(e), log_softmax(s)
        same += int((e.argmax(-1) == s.argmax(-1)).sum())
        kl += float((np.exp(le) * (le - ls)).sum())
        n += len(e)
    return same / n, kl / n


def engine_logits(model: str, settings: dict, windows: list[list[int]]) -> tuple[list[np.ndarray], ...]:
    """(logits of each window in one pass, the same a token a pass, the resolved graph settings)."""
    with Engine(model, settings=settings, cache_dir="") as engine:
        whole = [engine.logits(w) for w in windows]
        session = PagedSession(engine.compiled, engine.load_result.decode)
        stepped = []
        for w in windows:
            session.reset()
            stepped.append(np.concatenate([np.array(session.forward([t], 0), np.float32) for t in w]))
        return whole, stepped, engine.graph_settings


def llamacpp_logits(path: str, windows: list[list[int]]) -> list[np.ndarray]:
    import llama_cpp
    from engine_vs_genai import llamacpp_without_amx_repack

    llamacpp_without_amx_repack()
    llm = llama_cpp.Llama(model_path=path, n_ctx=2 * WINDOW, logits_all=True, verbose=False,
                          n_threads=os.cpu_count(), n_threads_batch=os.cpu_count())
    out = []
    for w in windows:
        llm.reset()
        llm.eval(w)
        out.append(np.array(llm.scores[:len(w)], dtype=np.float32))
    return out


def resolved(graph_settings: dict) -> str:
    keys = ("inference_precision", "kv_cache_precision", "zero_points", "kquant_requant")
    return ", ".join(f"{k}={graph_settings[k]}" for k in keys)


def agreement_rows(model: str, sides: dict[str, dict], positions: int, llamacpp: bool) -> None:
    print("  agreement with the exact graph (f32 compute, f32 KV):")
    with Engine(model, settings=EXACT, cache_dir="") as exact_engine:
        windows = prose_windows(exact_engine, positions)
        exact = [exact_engine.logits(w) for w in windows]
        path = str(exact_engine.model.path)
    n = sum(map(len, windows))
    for name, settings in sides.items():
        whole, stepped, graph_settings = engine_logits(model, settings, windows)
        (top1, kl), (one_top1, one_kl) = compare(exact, whole), compare(exact, stepped)
        print(f"  {name:<28} top-1 {top1:.4f}  KL {kl:.5f}; a token a pass: top-1 {one_top1:.4f}  "
              f"KL {one_kl:.5f}  over {n} positions  ({resolved(graph_settings)})")
    if llamacpp:
        top1, kl = compare(exact, llamacpp_logits(path, windows))
        print(f"  {'llama.cpp (its defaults)':<28} top-1 {top1:.4f}  KL {kl:.5f}  over {n} positions")


def prompt(engine: Engine, question: str) -> list[dict] | str:
    """The question as a chat message, or as a plain prompt for a base model (no chat template)."""
    if engine.load_report["chat"]:
        return [{"role": "user", "content": question}]
    return f"Question: {question}\nAnswer:"


def alone(engine: Engine) -> list[list[int]]:
    return [engine.complete(prompt(engine, q), max_tokens=ANSWER_TOKENS).token_ids for q in QUESTIONS]


def batched(engine: Engine) -> list[list[int]]:
    backend = EngineBackend(engine, slots=len(QUESTIONS))
    backend.wait_batching()
    params = SamplingParams(max_tokens=ANSWER_TOKENS)
    for i, q in enumerate(QUESTIONS):
        backend.add(str(i), prompt(engine, q), params)
    done: dict[str, list[int]] = {}
    while backend.active:
        done.update({ev.request_id: ev.completion.token_ids for ev in backend.step()
                     if isinstance(ev, Finished)})
    return [done[str(i)] for i in range(len(QUESTIONS))]


def answers_by_path(model: str, settings: dict) -> dict[str, list[list[int]]]:
    """Each path's greedy replies to QUESTIONS (PATHS, in order)."""
    with Engine(model, settings={**settings, "decode_graph": "on"}, cache_dir="") as engine:
        out = {PATHS[0]: alone(engine), PATHS[1]: batched(engine)}
        engine.warm_up()  # one-token passes run on the decode graph from here on
        out[PATHS[2]] = alone(engine)
    with Engine(model, settings={**settings, "attention": "sdpa"}, cache_dir="") as engine:
        out[PATHS[3]] = alone(engine)
    return out


def answer_rows(model: str, sides: dict[str, dict]) -> None:
    with Engine(model, settings=EXACT, cache_dir="") as exact_engine:
        reference = alone(exact_engine)
        for q, r in zip(QUESTIONS, reference, strict=True):
            print(f"  exact: {q!r} -> {exact_engine.detokenize(r)!r}")
        for name, settings in sides.items():
            for path, replies in answers_by_path(model, settings).items():
                same = sum(r == e for r, e in zip(replies, reference, strict=True))
                print(f"  {name:<28} {path:<14} {same}/{len(QUESTIONS)} replies equal the exact graph's")
                for q, r, e in zip(QUESTIONS, replies, reference, strict=True):
                    if r != e:
                        print(f"      {q!r} -> {exact_engine.detokenize(r)!r}")


def first_token_ms(engines: dict[str, Engine], ids: list[int], rounds: int) -> dict[str, list[float]]:
    """Per side, the wall ms of each round's 512-token prompt pass, sides alternating."""
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    out: dict[str, list[float]] = {side: [] for side in engines}
    for r in range(rounds):
        prompt = ids[r * 3:r * 3 + 512]  # a new first token each round: no prefix cache hit
        for side in list(engines)[::-1] if r % 2 else list(engines):
            gen = engines[side].generation(prompt, params)
            start = time.perf_counter()
            gen.step()
            out[side].append(1000 * (time.perf_counter() - start))
            gen.close()
    return out


def speed_rows(model: str, sides: dict[str, dict], steps: int, rounds: int) -> None:
    engines = {name: Engine(model, settings=s, cache_dir="") for name, s in sides.items()}
    try:
        for e in engines.values():
            e.warm_up()
        first = next(iter(engines.values()))
        ids = first.tokenize(TEXT.read_text(), add_special=False)
        ttft = first_token_ms(engines, ids, rounds)
        decode = step_times(engines, ids[:512], steps)
    finally:
        for e in engines.values():
            e.close()
    base = next(iter(sides))
    for name in sides:
        cpu, wall = np.median(decode[name], axis=0)
        ratio = np.median(decode[base][:, 1] / decode[name][:, 1])
        print(f"  {name:<28} decode {1000 / wall:6.1f} tok/s ({cpu:.2f} CPU ms/step; {base}/this per step "
              f"{ratio:.3f})  TTFT(512) median {np.median(ttft[name]):.0f} ms of {rounds}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="smollm2,gemma3-270m")
    p.add_argument("--candidate", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]")
    p.add_argument("--positions", type=int, default=2100)
    p.add_argument("--llamacpp", action="store_true", help="llama.cpp's agreement on the same windows")
    p.add_argument("--answers", action="store_true", help="sanity answers through every graph")
    p.add_argument("--speed", action="store_true", help="decode and TTFT of every side, paired")
    p.add_argument("--no-agreement", action="store_true", help="skip the agreement (e.g. speed only)")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--isa", choices=isa.CHOICES, help="emulate a CPU with fewer instructions")
    args = p.parse_args()
    isa.emulate(args.isa)
    sides = {"default": {}, **{c: parse_assignments(c.split(",")) for c in args.candidate}}
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"CPU: {isa.describe(CpuInfo.read(ov.Core()).describe())}; {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f} at start; {now}")
    for model in args.models.split(","):
        print(f"{model}:")
        if not args.no_agreement:
            agreement_rows(model, sides, args.positions, args.llamacpp)
        if args.answers:
            answer_rows(model, sides)
        if args.speed:
            speed_rows(model, sides, args.steps, args.rounds)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
