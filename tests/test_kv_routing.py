"""Prefix-aware placement knows the host KV tier (ovpool.broker.host_tiers): a prefix in a worker's
pool beats the same prefix in its host's tier, which beats none; hosts without a tier get no credit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from test_broker_prefix_routing import SYSTEM, dispatched, job, placement

from ovpool.broker.host_tiers import TIER_WORTH, HostTiers
from ovpool.broker.state import RegisteredWorker
from ovpool.protocol import Heartbeat, Ready
from ovpool.worker.engine import Engine


def worker(identity: bytes, host: str, tier: bool = True) -> RegisteredWorker:
    load = {"outcome": "hit", "kv_tier": True} if tier else {"outcome": "hit"}
    return RegisteredWorker(identity, Ready(identity.decode(), ["m"], "CPU", 8, host, 1, load), expires=1e9)


def chat(n: int) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": f"question {n}"}]


def forget_pools(p, out) -> None:
    """Every worker reports an empty pool twice: what the broker remembered of its pool is gone."""
    for w in p.workers.values():
        for _ in range(2):
            p.report(w, (), Heartbeat())


def test_a_prefix_in_the_host_tier_draws_its_request_after_the_pool_forgot_it():
    p, out = placement(), []
    for name, host in ((b"B", "h2"), (b"A", "h1")):  # B first: the least busy by default
        p.add_worker(worker(name, host), out)
    p.submit(job("warm", chat(0)), out)
    assert dispatched(out) == [(b"B", "warm")]
    p.finish(p.jobs["warm"], out)
    forget_pools(p, out)
    # On another worker of B's host, or after B restarted, the tier still holds the system prompt.
    p.add_worker(worker(b"C", "h2"), out)
    p.submit(job("busy", [{"role": "user", "content": "unrelated"}]), out)  # to B, now the busiest
    p.submit(job("next", chat(1)), out)
    assert dispatched(out)[-2:] == [(b"B", "busy"), (b"C", "next")]
    assert p.counters.prefix_hits == 1


def test_a_host_without_a_tier_gets_no_credit_for_what_ran_there():
    p, out = placement(), []
    p.add_worker(worker(b"A", "h1"), out)
    p.add_worker(worker(b"B", "h2", tier=False), out)
    p.submit(job("busy", [{"role": "user", "content": "unrelated"}]), out)  # A
    p.submit(job("warm", chat(0)), out)  # B, the least busy
    for rid in ("busy", "warm"):
        p.finish(p.jobs[rid], out)
    forget_pools(p, out)
    p.add_worker(worker(b"C", "h2", tier=False), out)
    p.submit(job("next", chat(1)), out)
    assert dispatched(out)[-1] == (b"A", "next") and p.counters.prefix_misses == 3


def test_the_pool_beats_the_tier_for_the_same_prefix_and_a_longer_tier_prefix_beats_a_short_pool():
    p, out = placement(), []
    a, b = worker(b"A", "h1"), worker(b"B", "h2")
    for w in (a, b):
        p.add_worker(w, out)
    route = job("x", chat(0)).route
    p.host_tiers.dispatched(a, route.keys)
    b.prefixes.remember(route.keys)
    assert p.host_tiers.score(b, route) > p.host_tiers.score(a, route) == TIER_WORTH * route.depths[-1]
    # A short system prompt, a long question: D's pool holds the first alone, A's tier both.
    brief = [{"role": "system", "content": "Be brief."}]
    long, d = job("y", [*brief, {"role": "user", "content": "words " * 300}]).route, worker(b"D", "h3")
    d.prefixes.remember(job("z", brief).route.keys)
    p.host_tiers.dispatched(a, long.keys)
    assert p.host_tiers.score(a, long) > p.host_tiers.score(d, long) == long.depths[0] > 0


@given(st.lists(st.tuples(st.integers(0, 5), st.lists(st.binary(min_size=1, max_size=2), max_size=6)),
                max_size=40))
def test_what_the_broker_remembers_of_host_tiers_is_bounded(events):
    tiers = HostTiers(keys_max=5, hosts_max=3)
    for host, keys in events:
        tiers.dispatched(worker(b"w", f"h{host}"), keys)
        assert len(tiers) <= 5 * 3 and len(tiers._hosts) <= 3


def test_a_worker_says_in_ready_whether_it_uses_the_host_tier(tiny_model, tmp_path):
    with Engine(tiny_model(), cache_dir=str(tmp_path), settings={"prefix_cache": "on"}) as engine:
        assert engine.load_report["kv_tier"] is True
    with Engine(tiny_model(), cache_dir=str(tmp_path), settings={"prefix_cache": "on",
                                                                 "kv_tier": False}) as engine:
        assert engine.load_report["kv_tier"] is False
