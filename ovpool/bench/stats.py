"""What one concurrency level measured: throughput, latency percentiles, and delivery checks (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class RequestRun:
    """One streamed request as the client saw it (seconds from the level's start)."""

    request_id: str
    submitted_s: float
    first_token_s: float | None = None
    done_s: float | None = None
    indices: list[int] = field(default_factory=list)  # Delta.index values in arrival order
    error: str | None = None


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def delivery_problem(run: RequestRun, expected_tokens: int) -> str | None:
    """Why a request was not delivered exactly once, token by token; None if it was."""
    if run.error is not None:
        return f"failed: {run.error}"
    if run.done_s is None:
        return "lost: never finished"
    if len(set(run.indices)) != len(run.indices):
        return "duplicated token indices"
    if run.indices != sorted(run.indices):
        return "token indices out of order"
    if run.indices and run.indices[-1] + 1 != expected_tokens:
        return f"lost tokens: last index {run.indices[-1]}, expected {expected_tokens - 1}"
    return None


def summarize(concurrency: int, runs: Sequence[RequestRun], expected_tokens: int) -> dict:
    """The row of one level: aggregate tokens/s over the level's wall time, p50/p99 latency and
    time to first token, and every request that was lost, duplicated or failed."""
    problems = {r.request_id: p for r in runs if (p := delivery_problem(r, expected_tokens))}
    good = [r for r in runs if r.request_id not in problems]
    wall = max((r.done_s for r in good), default=0.0) - min((r.submitted_s for r in runs), default=0.0)
    latencies = [r.done_s - r.submitted_s for r in good]
    ttfts = [r.first_token_s - r.submitted_s for r in good if r.first_token_s is not None]
    row = {"concurrency": concurrency, "requests": len(runs), "ok": len(good),
           "tokens": len(good) * expected_tokens, "wall_s": wall,
           "tokens_per_s": len(good) * expected_tokens / wall if wall > 0 else 0.0,
           "problems": problems}
    for name, values in (("latency", latencies), ("ttft", ttfts)):
        for q in (50, 99):
            row[f"{name}_p{q}_s"] = percentile(values, q) if values else None
    return row
