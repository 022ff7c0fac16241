"""ovpool bench bookkeeping: best-of-N keeps every run's delivery problems; ratios survive JSON."""

from __future__ import annotations

import json

from ovpool.bench.run import _best, ratios


def test_best_run_is_reported_but_problems_of_every_run_count():
    runs = [{"tokens_per_s": 50.0, "problems": {"7": "lost: never finished"}},
            {"tokens_per_s": 80.0, "problems": {}}]
    best = _best(runs)
    assert best["tokens_per_s"] == 80.0 and best["tokens_per_s_all"] == [50.0, 80.0]
    assert best["problems"] == {"run 0: 7": "lost: never finished"}


def test_ratios_against_genai_and_single_stream_after_a_json_round_trip():
    rows = [{"concurrency": 1, "ovpool": {"tokens_per_s": 90.0}, "genai_cb": {"tokens_per_s": 100.0}},
            {"concurrency": 8, "ovpool": {"tokens_per_s": 540.0}, "genai_cb": {"tokens_per_s": 500.0}}]
    r = json.loads(json.dumps(ratios(rows)))
    assert r["8"] == {"vs_genai_cb": 1.08, "vs_single": 6.0} and r["1"]["vs_genai_cb"] == 0.9
