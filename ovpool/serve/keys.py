"""CURVE for ``ovpool serve``'s own processes: closed by default, keys as files, never on a
command line (a child gets paths to them in its environment).

With a local broker serve makes the pool's own keys for the run (ovpool.pool_keys.PoolKeys, in a
private 0700 directory): its workers get the worker pair, its HTTP API and status client the
client pair, so no other process, another local user's included, can join or submit. Flags add
peers on other hosts: ``--curve-secret-key`` (the broker's pair, whose public key they hold),
``--curve-allowed-keys`` (their client keys), ``--curve-worker-keys`` (their worker keys).
``--open`` runs without CURVE. Joining a remote broker (``--broker``), ``--curve-secret-key`` is
this host's pair and ``--curve-server-key`` the broker's public key (none: a plain connection).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from ovpool.errors import ConfigError
from ovpool.pool_keys import PoolKeys
from ovpool.settings import REGISTRY, Settings

CURVE_SETTINGS = ("curve_secret_key", "curve_server_key", "curve_allowed_keys", "curve_worker_keys")
ROLES = ("broker", "worker", "client")


@dataclass(frozen=True)
class ChildKeys:
    """Each role's CURVE settings: the broker child, serve's workers, its clients (HTTP API, status)."""

    broker: dict[str, str] = field(default_factory=dict)
    worker: dict[str, str] = field(default_factory=dict)
    client: dict[str, str] = field(default_factory=dict)
    mode: str = "open: no CURVE, any process that can reach the broker may submit and serve"

    def env(self, role: str) -> dict[str, str]:
        """``role``'s CURVE settings as environment variables (every one set: none inherited)."""
        values = getattr(self, role)
        return {REGISTRY[name].env: values.get(name, "") for name in CURVE_SETTINGS}


@contextlib.contextmanager
def child_keys(settings: Settings, local_broker: bool, open_pool: bool = False) -> Iterator[ChildKeys]:
    """The children's CURVE settings for the run; a ConfigError names a flag that does not fit."""
    given = {name: settings[name] for name in CURVE_SETTINGS if settings[name]}
    if open_pool:
        if given:
            raise ConfigError(f"--open runs without CURVE: drop it, or drop {_flags(given)}")
        yield ChildKeys()
    elif local_broker:
        if "curve_server_key" in given:
            raise ConfigError("--curve-server-key is for joining a remote broker (--broker); serve's "
                              "own broker takes its pair from --curve-secret-key")
        with PoolKeys(broker_secret_key=settings.curve_secret_key, allowed_keys=settings.curve_allowed_keys,
                      worker_keys=settings.curve_worker_keys) as keys:
            yield ChildKeys(keys.broker_settings(), keys.worker_settings(), keys.client_settings(),
                            f"closed: the pool's own CURVE keys in {keys.path}")
    else:
        yield _joining(given)


def _joining(given: dict[str, str]) -> ChildKeys:
    """Joining a remote broker: this host's pair for its workers and its HTTP API alike."""
    extra = {"curve_allowed_keys", "curve_worker_keys"} & set(given)
    if extra:
        raise ConfigError(f"{_flags(extra)}: for serve's own broker; joining --broker, pass "
                          "--curve-secret-key (this host's pair) and --curve-server-key")
    if not given:
        return ChildKeys()
    if len(given) != 2:
        raise ConfigError("joining a CURVE broker needs both --curve-secret-key (this host's key pair) "
                          "and --curve-server-key (the broker's public key)")
    return ChildKeys(worker=given, client=given, mode="CURVE")


def _flags(names) -> str:
    return ", ".join("--" + name.replace("_", "-") for name in sorted(names))
