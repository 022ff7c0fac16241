"""Which commands each kind of peer may send the broker: a client submits, a worker serves.

Under CURVE the broker learns each message's sender key (the ZAP User-Id, the z85 public key)
and the roles that key holds: a key in ``curve_allowed_keys`` is a client's, one in
``curve_worker_keys`` a worker's (a key in both holds both). Without CURVE every peer holds both
roles, as before roles existed. STATUS, PING and SUPERVISED need either role: ``ovpool serve`` on
a worker host reads the status and reports its workers with that host's worker key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ovpool.protocol import (
    Cancel,
    Credit,
    Disconnect,
    Error,
    Final,
    Heartbeat,
    LoadFailed,
    ModelOrder,
    Partial,
    Ready,
    Submit,
)

CLIENT = 1
WORKER = 2
ANY = CLIENT | WORKER

_NEEDS: dict[type, int] = {
    **dict.fromkeys((Submit, Cancel, Credit, ModelOrder), CLIENT),
    **dict.fromkeys((Ready, Heartbeat, Partial, Final, Error, Disconnect, LoadFailed), WORKER),
}
_NAMES = {CLIENT: "a client's", WORKER: "a worker's", 0: "in no allowed directory"}
_DIRECTORY = {CLIENT: "curve_allowed_keys", WORKER: "curve_worker_keys"}


def allows(roles: int, command: type) -> bool:
    """Whether a peer holding ``roles`` may send a ``command``. A command the broker never takes
    (PONG, REQUEST, ...) passes: the router refuses it as malformed."""
    return bool(_NEEDS.get(command, ANY) & roles)


def by_key(clients: Iterable[str], workers: Iterable[str]) -> dict[str, int]:
    """Each allowed key's roles, from the z85 public keys of the clients and of the workers."""
    roles = dict.fromkeys(clients, CLIENT)
    for key in workers:
        roles[key] = roles.get(key, 0) | WORKER
    return roles


def refusal(roles: int, command: type) -> str:
    """Why a peer holding ``roles`` may not send ``command``, and which key it needs instead."""
    need = _NEEDS[command]
    name = re.sub(r"(?<!^)(?=[A-Z])", "_", command.__name__).upper()  # LoadFailed -> LOAD_FAILED
    return (f"this peer's CURVE key is {_NAMES[roles]}, so the broker refuses its {name}; "
            f"{'a client' if need == CLIENT else 'a worker'} needs a key pair whose public key is in "
            f"the broker's {_DIRECTORY[need]} directory")
