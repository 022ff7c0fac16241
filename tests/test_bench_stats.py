"""Benchmark bookkeeping: percentiles, throughput over wall time, lost/duplicated detection."""

from __future__ import annotations

from ovpool.bench.stats import RequestRun, delivery_problem, percentile, summarize


def test_percentile_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile([7.0], 99) == 7.0


def test_summary_counts_tokens_over_the_whole_wall_time():
    runs = [RequestRun("a", 0.0, 0.5, 2.0, [0, 1, 2]), RequestRun("b", 1.0, 1.2, 4.0, [0, 1, 2])]
    row = summarize(2, runs, expected_tokens=3)
    assert row["tokens"] == 6 and row["wall_s"] == 4.0 and row["tokens_per_s"] == 1.5
    assert row["latency_p50_s"] == 2.0 and row["latency_p99_s"] == 3.0
    assert row["ttft_p99_s"] == 0.5 and not row["problems"]


def test_lost_duplicated_and_failed_requests_are_reported():
    runs = [RequestRun("lost", 0.0, 0.1, None, [0]), RequestRun("dup", 0.0, 0.1, 1.0, [0, 1, 1]),
            RequestRun("short", 0.0, 0.1, 1.0, [0, 1]), RequestRun("err", 0.0, error="boom"),
            RequestRun("fine", 0.0, 0.1, 1.0, [0, 1, 2])]
    row = summarize(5, runs, expected_tokens=3)
    assert set(row["problems"]) == {"lost", "dup", "short", "err"} and row["ok"] == 1
    assert "duplicated" in row["problems"]["dup"] and "lost" in row["problems"]["short"]
    assert delivery_problem(runs[-1], 3) is None
