"""The multi-turn chat workload of ``ovpool bench --scenario chat`` (issue #16).

``conversations`` chats of ``turns`` turns run at once, each as a closed loop: a turn is sent when
the chat's previous answer is in, and resends the whole history (a ~1,000-token system prompt
shared by every chat, then each question and answer so far). What is measured per run: the time to
first token of each turn, the completion tokens per second of the whole run, and (pool runs) the
prompt tokens the workers took from their prefix caches (their heartbeat counters, before and
after).

Every run gets a system prompt of its own (a run number in its first line), so no run starts with
what an earlier one left in a cache.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack

from ovpool import timing
from ovpool.bench import peers, sweep
from ovpool.bench.workload import ChatRun, Turn, question, system_prompt
from ovpool.client import Client

Messages = list[dict[str, str]]
# One turn: (messages, max_tokens) -> (time to first token or None, answer text, completion tokens).
TurnRunner = Callable[[Messages, int], tuple[float | None, str, int]]


def run_pool(client: Client, run: int, conversations: int, turns: int, max_tokens: int,
             documents: bool = False, think_s: float = 0.0) -> dict:
    """The workload through a pool (``documents``: see ``question``; ``think_s``: see
    ``_closed_loops``); with the workers' prefix-cache counters for this run."""
    before = _prompt_counters(client)
    result = _closed_loops(lambda msgs, n: _stream_turn(client, msgs, n), run, conversations, turns,
                           max_tokens, documents, think_s)
    after = _wait_for_reports(client, before)
    prompt, cached = (sum(a[k] - before.get(w, {}).get(k, 0) for w, a in after.items())
                      for k in ("prompt_tokens", "cached_prompt_tokens"))
    counters = client.status()["counters"]
    return {**result, "prompt_tokens": prompt, "cached_prompt_tokens": cached,
            "cached_share": cached / prompt if prompt else None,
            "prompt_tokens_by_worker": sorted(a["prompt_tokens"] - before.get(w, {}).get("prompt_tokens", 0)
                                              for w, a in after.items()),
            "router": {k: counters.get(k, 0) for k in ("prefix_hits", "prefix_misses")}}


def _closed_loops(turn: TurnRunner, run: int, conversations: int, turns: int, max_tokens: int,
                  documents: bool = False, think_s: float = 0.0) -> dict:
    """Every conversation on a thread of its own, its turns one after the other, with a pause of
    0 to ``think_s`` seconds (fixed per chat and turn) between them: a user reading the answer.
    Without pauses the loops stay in step, and a chat's next turn finds the slot its last turn just
    freed the least busy one, so least-loaded routing keeps every chat on its worker too."""
    out = ChatRun()
    lock = threading.Lock()
    start = threading.Barrier(conversations + 1)

    def chat(c: int) -> None:
        messages = [{"role": "system", "content": system_prompt(run)}]
        start.wait()
        for t in range(turns):
            messages.append({"role": "user", "content": question(c, t, documents)})
            record = Turn(c, t)
            try:
                record.ttft_s, answer, tokens = turn(messages, max_tokens)
            except Exception as exc:  # reported per turn: a failure is a result, not a crash
                record.error = f"{type(exc).__name__}: {exc}"
                answer, tokens = "", 0
            messages.append({"role": "assistant", "content": answer})
            time.sleep(think_s * ((c * 7 + t) % 5) / 4)
            with lock:
                out.turns.append(record)
                out.completion_tokens += tokens

    threads = [threading.Thread(target=chat, args=(c,), daemon=True) for c in range(conversations)]
    for th in threads:
        th.start()
    start.wait()
    t0 = time.perf_counter()
    for th in threads:
        th.join()
    out.wall_s = time.perf_counter() - t0
    return out.summary()


def _stream_turn(client: Client, messages: Messages, max_tokens: int) -> tuple[float | None, str, int]:
    t0 = time.perf_counter()
    ttft, text, tokens = None, [], 0
    for delta in client.stream(messages, max_tokens=max_tokens, ignore_eos=True):
        if ttft is None:
            ttft = time.perf_counter() - t0
        text.append(delta.text)
        tokens += 1
    return ttft, "".join(text), tokens


def _prompt_counters(client: Client) -> dict[str, dict]:
    return {w["id"]: dict(w.get("prefix_cache") or {}) for w in client.status()["workers"]}


def _wait_for_reports(client: Client, before: dict[str, dict], timeout: float = 30.0) -> dict[str, dict]:
    """The workers' counters once they stand still over two heartbeat intervals: a report lags the
    last request of the run by up to one."""
    deadline = time.monotonic() + timeout
    last = _prompt_counters(client)
    while time.monotonic() < deadline:
        time.sleep(timing.HEARTBEAT_INTERVAL_S * 2.5)  # every worker has reported since
        now = _prompt_counters(client)
        if now == last:
            return now
        last = now
    return last


def ratios(results: dict) -> dict:
    """The issue's ratios from the chat scenario's runs (None where a run is missing)."""
    one, two = results.get("one_worker", {}), results.get("two_workers", {})
    genai = results.get("genai_prefix")

    def ratio(a, b):
        return a / b if a is not None and b else None

    on, off = one.get("prefix_on", {}), one.get("prefix_off", {})
    return {
        "ttft_later_turns_on_vs_off": ratio(on.get("ttft_later_turns_median_s"),
                                            off.get("ttft_later_turns_median_s")),
        "tokens_per_s_on_vs_off": ratio(on.get("tokens_per_s"), off.get("tokens_per_s")),
        "tokens_per_s_vs_genai_prefix": ratio(on.get("tokens_per_s"), (genai or {}).get("tokens_per_s")),
        "ttft_later_turns_vs_genai_prefix": ratio(on.get("ttft_later_turns_median_s"),
                                                  (genai or {}).get("ttft_later_turns_median_s")),
        "two_workers_cached_share_prefix_vs_one": ratio(two.get("prefix", {}).get("cached_share"),
                                                        on.get("cached_share")),
        "two_workers_cached_share_least_loaded_vs_one": ratio(two.get("least_loaded", {}).get("cached_share"),
                                                              on.get("cached_share")),
        "two_workers_documents_cached_share_prefix_vs_least_loaded": ratio(
            two.get("prefix_documents", {}).get("cached_share"),
            two.get("least_loaded_documents", {}).get("cached_share")),
    }


# The pool's patience, for a loaded host: without the prefix cache the last of 16 chats waits for
# 16 x ~1,100 prompt tokens to be prefilled before its first token, which can take longer than
# the 60 s progress timeout (docs/performance.md, "ovpool/bench/chat.py").
POOL_ENV = {"OVPOOL_PROGRESS_TIMEOUT_S": "1800", "OVPOOL_HEARTBEAT_INTERVAL_S": "3"}
# Every chat's KV without preemption: 16 x ~1,400 tokens x 23 KiB (SmolLM2 at f16) = ~500 MiB;
# GenAI's pipeline gets the same 1 GiB (peers.ChatPipeline).
KV_CACHE_MB = 1024
# Every pool's settings: the runs of each invocation are numbered from 1, so a KV tier on disk
# (kept across restarts) would hand a run the blocks an earlier invocation's run of that number
# computed, answers included, which GenAI's side never gets (docs/performance.md, Chat TTFT).
POOL_SETS = (f"kv_cache_mb={KV_CACHE_MB}", "kv_tier=off")


def scenario(model: str, path: str, *, conversations: int, turns: int, max_tokens: int, repeats: int,
             sets: tuple[str, ...], genai: bool, device: str, say: Callable[[str], None]) -> dict:
    """One worker with its prefix cache on vs off, alternating (and GenAI with prefix caching in
    the same rounds); then two workers, prefix-aware vs least-loaded routing, one after the other
    (what they are compared on, the share of prompt tokens from cache, does not depend on load)."""
    base = (*POOL_SETS, *sets)
    tries: dict[str, list[dict]] = {"prefix_on": [], "prefix_off": [], "genai": []}
    counter = iter(range(1, 1_000_000))
    with ExitStack() as stack:
        on = stack.enter_context(sweep.pool(model, conversations, sets=(*base, "prefix_cache=on"),
                                            env=POOL_ENV))
        off = stack.enter_context(sweep.pool(model, conversations, sets=(*base, "prefix_cache=off"),
                                             env=POOL_ENV))
        pipe = peers.ChatPipeline(path, device) if genai else None
        for i in range(repeats):
            say(f"chat: round {i + 1} of {repeats}: prefix cache on, off{', GenAI' if pipe else ''}")
            tries["prefix_on"].append(run_pool(on, next(counter), conversations, turns, max_tokens))
            tries["prefix_off"].append(run_pool(off, next(counter), conversations, turns, max_tokens))
            if pipe is not None:
                tries["genai"].append(pipe.run(next(counter), conversations, turns, max_tokens))
    results: dict = {"workload": {"conversations": conversations, "turns": turns, "max_tokens": max_tokens,
                                  "system_prompt_chars": len(system_prompt(0)), "repeats": repeats},
                     "one_worker": {k: _fastest(v) for k, v in tries.items() if k != "genai"},
                     "runs": tries}
    if tries["genai"]:
        results["genai_prefix"] = _fastest(tries["genai"])
    results["two_workers"] = {}
    # The workload as specified, then with a ~1,150-token document of its own in each chat's first
    # question (a prefix that only one worker holds, unlike the system prompt both soon hold) and
    # users who pause up to 2 s before their next turn.
    for routing, documents in itertools.product(("prefix", "least_loaded"), (False, True)):
        say(f"chat: two workers, routing={routing}{', documents and pauses' if documents else ''}")
        # Each with the single worker's slots: a pool with room to choose. At full slots every
        # turn could only go where its chat's last turn just freed a slot, whatever the routing.
        with sweep.pool(model, conversations, sets=(*base, "prefix_cache=on"), workers=2,
                        env={**POOL_ENV, "OVPOOL_ROUTING": routing}) as client:
            results["two_workers"][routing + ("_documents" if documents else "")] = run_pool(
                client, next(counter), conversations, turns, max_tokens, documents, 2.0 if documents else 0.0)
    results["ratios"] = ratios(results)
    return results


def _fastest(runs: list[dict]) -> dict:
    """The run with the most tokens/s (load from other processes only ever slows a run down)."""
    return max(runs, key=lambda r: r["tokens_per_s"] or 0.0)
