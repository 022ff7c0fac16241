"""Another local user's process trying to join a pool as a worker (tests/test_pool_isolation.py).

    python tests/hostile_peer.py ENDPOINT BROKER_PUBLIC_Z85 [FILE ...]

Started as root, it becomes uid/gid 65534 (nobody, no groups) once its modules are loaded: the
venv's interpreter may sit where that user cannot read (/root/.pyenv, 0700), so setpriv could
not start it, and every check after the switch (files, sockets) is that user's. It tries to read
each FILE (the pool's key pairs), then joins ENDPOINT as a worker of model "m": with no keys, with
a key pair of its own and the broker's public key (no secret), and with each pair it could read.
A connection whose handshake completes registers and waits for a REQUEST. It prints one JSON
line of what happened.
"""

from __future__ import annotations

import json
import os
import sys

import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from ovpool.protocol import Ready, Request, decode, encode

NOBODY = 65534
WAIT_MS = 30_000  # a bound for what is on its way (a handshake, a pending REQUEST), not a timing
_OUTCOMES = {zmq.EVENT_HANDSHAKE_SUCCEEDED: "succeeded", zmq.EVENT_HANDSHAKE_FAILED_AUTH: "key refused",
             zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "failed", zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "failed"}


def become_nobody() -> list[int]:
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    return list(os.getresuid())


def read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.read()
    except PermissionError:
        return "denied"
    except OSError as exc:
        return type(exc).__name__
    return "read"


def join_as_worker(context: zmq.Context, endpoint: str, server_key: bytes | None,
                   pair: tuple[bytes, bytes] | None = None) -> dict:
    """What one connection got: its handshake's outcome, and the prompts of REQUESTs sent to it."""
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    if server_key is not None:
        sock.curve_publickey, sock.curve_secretkey = pair or zmq.curve_keypair()
        sock.curve_serverkey = server_key
    monitor = sock.get_monitor_socket(sum(_OUTCOMES))
    sock.connect(endpoint)
    outcome = _OUTCOMES[recv_monitor_message(monitor)["event"]] if monitor.poll(WAIT_MS) else "none"
    prompts = []
    if outcome == "succeeded":
        sock.send_multipart(encode(Ready("hostile", ["m"], "CPU", 64, "hostile", os.getpid())))
        while not prompts and sock.poll(WAIT_MS):  # broker HEARTBEATs come too
            msg = decode(sock.recv_multipart())
            if isinstance(msg, Request):
                prompts.append(msg.prompt)
    sock.disable_monitor()
    monitor.close()
    sock.close()
    return {"handshake": outcome, "requests": prompts}


def main() -> None:
    endpoint, server_key, files = sys.argv[1], sys.argv[2].encode(), sys.argv[3:]
    uid = become_nobody()
    context = zmq.Context()
    readable = [f for f in files if read(f) == "read"]
    report = {"uid": uid, "files": [read(f) for f in files],
              "no keys": join_as_worker(context, endpoint, None),
              "own keys": join_as_worker(context, endpoint, server_key),
              "stolen keys": [join_as_worker(context, endpoint, server_key, zmq.auth.load_certificate(f))
                              for f in readable]}
    context.destroy(linger=0)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
