"""The sweep's pool path on a tiny model: a real broker and a batching worker process, N streams."""

from __future__ import annotations

import pytest

from ovpool.bench.sweep import pool, sweep_level


@pytest.mark.slow
def test_concurrent_streams_through_a_batching_worker_are_each_delivered_once(tiny_model, tmp_path):
    model = str(tiny_model(arch="llama", weight_type="Q8_0"))
    with pool(model, slots=4, sets=("prefill_chunk=8",), log=tmp_path / "pool.log") as client:
        row = sweep_level(client, 6, max_tokens=12)  # more requests than slots: two have to queue
    assert row["problems"] == {} and row["ok"] == 6 and row["tokens"] == 72
    assert row["latency_p99_s"] >= row["latency_p50_s"] > 0 and row["ttft_p99_s"] is not None
