"""The cyclic garbage collector's policy in a long-running server process (``settle``).

A request's objects are freed by reference counting as it ends; the collector finds next to none
of them. Yet at CPython's default threshold (a young
collection every 700 net allocations) the objects of the requests in flight trip one every few
requests, and those that survive it are promoted and later walked again by full collections,
together with every object the process made at start (tens of thousands: modules, classes). So
``settle`` freezes the start-up heap (never walked again) and collects the young generation every
YOUNG_THRESHOLD net allocations: cycles are still freed, each within that many allocations.
Figures: docs/performance.md, HTTP API overhead.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000  # objects: a few MB of cyclic garbage at most between collections


def settle() -> None:
    """Call once the process has imported and built what it keeps for its lifetime."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
