"""Where a single-stream decode step's time goes in the Engine: the graph's infer() against the host
work around it (the scheduler's plan and commit, building the pass's inputs, sampling, detokenizing
and streaming), per step, medians per generation: wall, and the CPU time of the thread that runs
the step (the host parts' own cost, however loaded the host; infer()'s share of that thread).

    .venv/bin/python benchmarks/decode_step.py [--model smollm2] [--set NAME=VALUE ...] [--rounds 4]
        [--prompt-tokens 512] [--new-tokens 128]

Each part is timed by wrapping the method that does it (``Batcher.step``, ``Scheduler.plan``,
``Scheduler.commit``, ``PagedRunner.forward``, ``Batcher._accept``; infer() on the runner's
requests); a wrapper costs ~1 us. ``host`` is the step's CPU outside infer(). Prompt lookup is off
(plain decode, as benchmarks/engine_vs_genai.py measures it). The output names the CPU class and load.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections import defaultdict

from engine_vs_genai import prompt_ids

from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.settings import parse_assignments
from ovpool.worker.generate.batch import PagedRunner
from ovpool.worker.generate.batcher import Batcher
from ovpool.worker.generate.scheduler import Scheduler
from ovpool.worker.graph.cpu_class import CpuInfo

PARTS = {"step": (Batcher, "step"), "plan": (Scheduler, "plan"), "commit": (Scheduler, "commit"),
         "forward": (PagedRunner, "forward"), "accept": (Batcher, "_accept")}


def clock() -> tuple[float, float]:
    """(wall, this thread's CPU) seconds: a host part's CPU time does not count time spent
    descheduled, which on a loaded host is most of its wall time."""
    return time.perf_counter(), time.thread_time()


def timing(seconds: dict[str, list[tuple[float, float]]], name: str, fn):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[name].append(tuple(b - a for a, b in zip(start, clock(), strict=True)))
    return timed


class TimedRequest:
    """An InferRequest whose infer() and start_async()..wait() are timed as ``infer``."""

    def __init__(self, request, seconds: dict[str, list[float]]):
        self._request, self._seconds, self._start = request, seconds, (0.0, 0.0)

    def infer(self, *args, **kwargs):
        return timing(self._seconds, "infer", self._request.infer)(*args, **kwargs)

    def start_async(self, *args, **kwargs):
        self._start = clock()
        return self._request.start_async(*args, **kwargs)

    def wait(self):
        self._request.wait()
        self._seconds["infer"].append(tuple(b - a for a, b in zip(self._start, clock(), strict=True)))

    def __getattr__(self, name):
        return getattr(self._request, name)


def decode_steps(engine: Engine, prompt: list[int], new_tokens: int, seconds) -> None:
    """One generation; the parts of its decode steps (after the first token) in ``seconds``."""
    with engine.generation(prompt, SamplingParams(max_tokens=new_tokens, ignore_eos=True)) as gen:
        gen.step()
        seconds.clear()
        while not gen.finished:
            gen.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--set", action="append", default=[], help="an engine setting NAME=VALUE")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    args = p.parse_args()
    settings = {"prompt_lookup": "off", **parse_assignments(args.set)}
    seconds: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with Engine(args.model, settings=settings, cache_dir="") as engine:
        engine.warm_up()
        for name, (owner, method) in PARTS.items():
            setattr(owner, method, timing(seconds, name, getattr(owner, method)))
        runner = engine._streams().batcher.runner
        print(f"cpu: {CpuInfo.read(engine.core).describe()}; {engine.graph_settings}; "
              f"decode graph {'on' if runner.decode is not None else 'off'}")
        prompts = prompt_ids(args.model, args.prompt_tokens, args.rounds + 1)
        decode_steps(engine, prompts[-1], 8, seconds)  # the decode graph's request made
        runner.requests[:] = [TimedRequest(r, seconds) for r in runner.requests]
        for r, prompt in enumerate(prompts[:-1]):
            load = os.getloadavg()[0]
            decode_steps(engine, prompt, args.new_tokens, seconds)
            wall = {name: 1e6 * statistics.median(w for w, _ in v) for name, v in seconds.items()}
            cpu = {name: 1e6 * statistics.median(c for _, c in v) for name, v in seconds.items()}
            parts = ", ".join(f"{name} {cpu[name]:.0f}" for name in ("plan", "commit", "accept"))
            print(f"round {r} (load {load:.1f}): step {wall['step']:.0f} us wall, infer {wall['infer']:.0f}; "
                  f"main thread's CPU: step {cpu['step']:.0f} us = infer {cpu['infer']:.0f} + host "
                  f"{cpu['step'] - cpu['infer']:.0f} (inputs and logits "
                  f"{cpu['forward'] - cpu['infer']:.0f}, {parts})")


if __name__ == "__main__":
    main()
