"""Which route keys a worker still holds the KV of: what it tells the broker's placement.

A route key is opaque here (the broker computes them over a request's text, see the contract in
docs/prefix-caching.md); a request's keys are held while its sequence runs, and after it ends for
as long as the last full KV block of its sequence stays cached. Bounded: the oldest finished
requests' keys are forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence


class HeldKeys:
    """Route keys of finished requests, each with the address of its sequence's last full block."""

    def __init__(self, limit: int):
        self.limit = limit
        self._tails: OrderedDict[bytes, bytes] = OrderedDict()  # least recently used first

    def note(self, keys: Sequence[bytes], tail: bytes) -> None:
        """A request with ``keys`` ended; its KV chain ends at the block addressed ``tail``."""
        for key in keys:  # chained: the last is the deepest, listed first (most specific)
            self._tails[key] = tail
            self._tails.move_to_end(key)
        while len(self._tails) > self.limit:
            self._tails.popitem(last=False)

    def held(self, running: Iterable[tuple[Sequence[bytes], bytes]], holds: Callable[[bytes], bool],
             limit: int) -> list[bytes]:
        """Up to ``limit`` keys, most recently used first: those of ``running`` (keys, tail) pairs,
        then the finished ones whose tail the pool ``holds``; keys whose tail is gone are dropped."""
        keys: dict[bytes, None] = {}
        for request_keys, _ in running:
            keys.update(dict.fromkeys(reversed(request_keys)))
        for key in reversed([k for k, tail in self._tails.items() if not holds(tail)]):
            del self._tails[key]
        keys.update(dict.fromkeys(reversed(self._tails)))
        return list(keys)[:max(limit, 0)]
