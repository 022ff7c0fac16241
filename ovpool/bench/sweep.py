"""The concurrency sweep: N streamed requests at once through a real broker and worker process.

One broker and one worker (``slots`` = the largest level) run as child processes, exactly as
``ovpool broker`` / ``ovpool worker`` would. Each level starts N client threads together; each
streams one request of ``max_tokens`` tokens (``ignore_eos``, so every request has the same
length) and records when it was sent, its first token, its end, and every token index it got.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path

from ovpool.bench.stats import RequestRun, summarize
from ovpool.client import Client
from ovpool.testing.pool import PoolProcess, broker, check_running, free_endpoint, wait_for_workers

# Distinct openings so that no two requests of a level are the same sequence.
PROMPTS = tuple(f"Tell me a short story about a {w}." for w in (
    "cat", "dog", "fox", "owl", "bee", "ant", "cow", "pig", "hen", "elk", "yak", "bat", "eel", "ram",
    "jay", "emu"))
WORKER_START_S = 900.0  # a cold start builds and compiles the graphs; a loaded 2-core host is slow


@contextlib.contextmanager
def pool(model: str, slots: int, *, sets: Sequence[str] = (), log: Path | None = None, workers: int = 1,
         env: dict[str, str] | None = None) -> Iterator[Client]:
    """A broker and ``workers`` workers serving ``model`` with ``slots`` each (``env``: for all of
    them, e.g. settings as OVPOOL_* variables); yields a connected, warmed-up Client once every
    worker runs batched (its paged graph loads after it registers)."""
    endpoint = free_endpoint()
    with ExitStack() as stack:
        if log is None:
            log = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ovpool-bench-"))) / "pool.log"
        processes = [stack.enter_context(broker(endpoint, log=log, env=env))]
        extra = [arg for item in sets for arg in ("--set", item)]
        for _ in range(workers):
            processes.append(stack.enter_context(PoolProcess(
                "worker", "--broker", endpoint, "--model", model, "--slots", str(slots), *extra, env=env,
                log=log)))
        client = stack.enter_context(Client(endpoint))
        wait_for_workers(client, workers, timeout=WORKER_START_S, processes=processes)
        if "batching=interleaved" not in sets:
            _wait_for_line(log, ("continuous batching:", "continuous batching is off"), WORKER_START_S,
                           processes, count=workers)
        run_level(client, workers, 4)  # warm-up: first-use allocations are not part of any level
        yield client


def _wait_for_line(log: Path, needles: Sequence[str], timeout: float, processes: Sequence[PoolProcess],
                   count: int = 1) -> None:
    """Until ``log`` has ``count`` lines holding one of ``needles``; at once if a process ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check_running(processes)
        lines = log.read_text(errors="replace").splitlines()
        if sum(any(n in line for n in needles) for line in lines) >= count:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{count} worker(s) did not log any of {list(needles)} within {timeout:.0f}s"
                       f" (see {log})")


def sweep_level(client: Client, concurrency: int, max_tokens: int) -> dict:
    """One summary row (ovpool.bench.stats.summarize) for ``concurrency`` requests at once."""
    return summarize(concurrency, run_level(client, concurrency, max_tokens), max_tokens)


def run_level(client: Client, concurrency: int, max_tokens: int) -> list[RequestRun]:
    runs = [RequestRun(str(i), 0.0) for i in range(concurrency)]
    start = threading.Barrier(concurrency + 1)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=_stream, args=(client, run, PROMPTS[i % len(PROMPTS)], max_tokens,
                                                      start, t0), daemon=True)
               for i, run in enumerate(runs)]
    for t in threads:
        t.start()
    start.wait()
    for t in threads:
        t.join()
    if any(run.error for run in runs):  # a broker that is gone ends the bench with why (it raises)
        client.status()
    return runs


def _stream(client: Client, run: RequestRun, prompt: str, max_tokens: int, start: threading.Barrier,
            t0: float) -> None:
    start.wait()
    run.submitted_s = time.perf_counter() - t0
    try:
        for delta in client.stream(prompt, max_tokens=max_tokens, ignore_eos=True):
            if run.first_token_s is None:
                run.first_token_s = time.perf_counter() - t0
            run.indices.append(delta.index)
        run.done_s = time.perf_counter() - t0
    except Exception as exc:  # reported per request: a failure is a result, not a crash
        run.error = f"{type(exc).__name__}: {exc}"
