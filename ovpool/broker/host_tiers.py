"""What the broker believes each host's KV tier holds (pure, bounded): the route keys of the
requests it dispatched to a worker there with a tier (READY's ``load.kv_tier``).

Every worker of a host with the tier on writes its full prompt blocks to the host's disk tier,
which every worker of the same graph there reads (docs/prefix-caching.md), so a prefix one of
them computed is cheap for all of them, even after it left the worker's pool or the worker
restarted. The broker never hears of the tier's contents; what it dispatched is a good guess of
them, approximate as the remembered keys of a pool (broker/prefixes.py): a tier evicts too.

Placement scores a worker by the longer of its pool's prefix and ``TIER_WORTH`` of its host tier's,
so a prefix in a pool beats the same prefix in the tier, which beats none: loading a 2,000-token
prefix from the tier took 0.09-0.15x the time of computing it (docs/prefix-caching.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from ovpool.broker.state import RegisteredWorker
from ovpool.prefix_key import RouteKeys

TIER_WORTH = 0.85  # a character of prefix in the host tier, against one in the worker's pool
_KEYS_MAX = 4096  # route keys remembered per host
_HOSTS_MAX = 256


class HostTiers:
    def __init__(self, keys_max: int = _KEYS_MAX, hosts_max: int = _HOSTS_MAX):
        self.keys_max, self.hosts_max = keys_max, hosts_max
        self._hosts: OrderedDict[str, OrderedDict[bytes, None]] = OrderedDict()

    def __len__(self) -> int:
        return sum(map(len, self._hosts.values()))

    def dispatched(self, worker: RegisteredWorker, keys: Iterable[bytes]) -> None:
        """``keys`` went to ``worker``: its host's tier will hold them, if it has one."""
        if not _has_tier(worker):
            return
        held = self._hosts.setdefault(worker.info.host, OrderedDict())
        self._hosts.move_to_end(worker.info.host)
        for key in keys:
            held[key] = None
            held.move_to_end(key)
        while len(held) > self.keys_max:
            held.popitem(last=False)
        while len(self._hosts) > self.hosts_max:
            self._hosts.popitem(last=False)

    def depth(self, worker: RegisteredWorker, route: RouteKeys) -> int:
        """Characters of ``route``'s longest prefix ``worker``'s host tier is believed to hold."""
        held = self._hosts.get(worker.info.host)
        return route.deepest_in(held) if held and route.keys and _has_tier(worker) else 0

    def score(self, worker: RegisteredWorker, route: RouteKeys) -> float:
        """How much of ``route``'s prefix ``worker`` need not compute, in pool characters."""
        return max(worker.prefixes.depth(route), TIER_WORTH * self.depth(worker, route))


def _has_tier(worker: RegisteredWorker) -> bool:
    return bool(worker.info.load.get("kv_tier"))
