"""What the broker believes one worker holds in its prefix cache (pure, bounded).

Two sources, both route keys (ovpool.prefix_key):

- the worker's own report, in each HEARTBEAT: the keys whose KV it still caches (at most
  protocol.HELD_KEYS_MAX), and its prompt / cached-prompt token counters;
- the broker's memory of its own traffic: the keys of each request it dispatched there, and at
  its FINAL those of the conversation with the answer appended (what a chat's next turn resends).
  The worker reports these only at its next heartbeat, up to a second later, while the next turn
  of a chat comes at once.

Remembered keys are approximate (the worker may have evicted them since), so the reports correct
them: a key remembered before the previous report is forgotten at the next one, by which time the
worker has had a full heartbeat interval to report it if it holds it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from ovpool.prefix_key import RouteKeys

_REMEMBER_MAX = 512  # keys remembered per worker between reports (~32 requests of 16 messages)


class HeldPrefixes:
    def __init__(self) -> None:
        self.reported: frozenset[bytes] = frozenset()
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self._reports = 0
        self._remembered: OrderedDict[bytes, int] = OrderedDict()  # key -> reports seen when added

    def __len__(self) -> int:
        return len(self.reported | self._remembered.keys())

    def __contains__(self, key: object) -> bool:
        return key in self._remembered or key in self.reported

    def depth(self, route: RouteKeys) -> int:
        """Characters of ``route``'s longest prefix this worker is believed to hold."""
        return route.deepest_in(self) if route.keys else 0

    def remember(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            self._remembered[key] = self._reports
            self._remembered.move_to_end(key)
        while len(self._remembered) > _REMEMBER_MAX:
            self._remembered.popitem(last=False)

    def report(self, held: Iterable[bytes], prompt_tokens: int, cached_prompt_tokens: int) -> None:
        """A HEARTBEAT's summary: it replaces the last, and ends what was remembered before that."""
        self.reported = frozenset(held)
        self.prompt_tokens, self.cached_prompt_tokens = prompt_tokens, cached_prompt_tokens
        self._reports += 1
        remembered = self._remembered  # oldest first, so the stale ones are at its front
        while remembered and next(iter(remembered.values())) < self._reports - 1:
            remembered.popitem(last=False)

    def describe(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "cached_prompt_tokens": self.cached_prompt_tokens,
                "held_keys": len(self)}
