"""The collector's policy of the server processes (ovpool.gc_policy): fewer collections, yet
reference cycles are still freed, so memory stays bounded."""

from __future__ import annotations

import gc

from ovpool import gc_policy


def test_cycles_are_still_freed_after_settle():
    saved, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    try:
        gc_policy.settle()
        gc.collect()
        start = len(gc.get_objects())
        for _ in range(10 * gc_policy.YOUNG_THRESHOLD):
            cycle: list = []
            cycle.append(cycle)  # garbage that only the collector frees, once rebound
        assert len(gc.get_objects()) - start < 2 * gc_policy.YOUNG_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)
        if not enabled:
            gc.disable()
