"""CURVE encryption and authentication for the pool's sockets (pyzmq's zmq.auth).

The broker holds a key pair and two directories of allowed public keys (one ``.key`` file per
peer): its clients' (``curve_allowed_keys``) and its workers' (``curve_worker_keys``); a key's
directory is its role (broker/roles.py). Peers hold their own key pair and the broker's public
key. Key files are the ZeroMQ certificate format written by ``ovpool keys generate``; PoolKeys
(ovpool/pool_keys.py) makes a pool's own set for one run.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Container
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from ovpool.broker import roles
from ovpool.errors import AuthenticationError, ConfigError
from ovpool.settings import Settings

log = logging.getLogger(__name__)


def generate(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``NAME.key`` (public, to share) and ``NAME.key_secret`` (private) into ``directory``."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        public, secret = zmq.auth.create_certificates(directory, name)
    except OSError as exc:
        raise ConfigError(f"cannot write CURVE keys into {directory}: {exc}") from exc
    Path(secret).chmod(0o600)
    return Path(public), Path(secret)


def load_key(path: str, *, need_secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read CURVE key file {path}: {exc}") from exc
    if need_secret and secret is None:
        raise ConfigError(f"{path} holds only a public key; pass the .key_secret file of the pair")
    return public, secret


def secure_peer(socket: zmq.Socket, settings: Settings) -> None:
    """Make a client/worker socket a CURVE client when settings name its keys (before connect)."""
    mine, server = settings.curve_secret_key, settings.curve_server_key
    if not mine and not server:
        return
    if not (mine and server):
        raise ConfigError("CURVE needs both curve_secret_key (this peer's pair) and curve_server_key"
                          " (the broker's public key)")
    public, secret = load_key(mine, need_secret=True)
    socket.curve_publickey, socket.curve_secretkey = public, secret
    socket.curve_serverkey = load_key(server, need_secret=False)[0]


class ServerSecurity:
    """The broker side: a CURVE server socket plus an authenticator thread checking client keys.
    ``roles`` maps each allowed key (its z85 public key, the ZAP User-Id of its messages) to the
    roles it holds (broker/roles.py); None without CURVE, where every peer holds both."""

    def __init__(self, context: zmq.Context, settings: Settings):
        self.enabled = bool(settings.curve_secret_key)
        self.roles: dict[str, int] | None = None
        self._context, self._settings = context, settings
        self._auth: ThreadAuthenticator | None = None
        self._pair: tuple[bytes, bytes] | None = None  # read once: every socket gets the same pair
        for name in _ALLOWED:
            if settings[name] and not self.enabled:
                raise ConfigError(f"{name} needs curve_secret_key (the broker's key pair)")

    def __enter__(self) -> ServerSecurity:
        if self.enabled:
            public, secret = load_key(self._settings.curve_secret_key, need_secret=True)
            self._pair = (public, secret)
            self.roles = roles.by_key(*(_public_keys(self._settings, name) for name in _ALLOWED))
            self._auth = ThreadAuthenticator(self._context)
            self._auth.start()
            self._auth.configure_curve_callback(domain="*", credentials_provider=_AllowedKeys(self.roles))
            # Only the pair's own key may read a standby broker's states (broker/standby.py).
            self._auth.configure_curve_callback(domain=PAIR_DOMAIN,
                                                credentials_provider=_AllowedKeys({public.decode("ascii")}))
        return self

    def mode(self) -> str:
        """Which mode the broker runs in, for its start-up log line."""
        if self.roles is None:
            return "open: no CURVE, any peer that can connect may submit and register as a worker"
        held = list(self.roles.values())
        return (f"CURVE with roles: {sum(r & roles.CLIENT > 0 for r in held)} client key(s),"
                f" {sum(r & roles.WORKER > 0 for r in held)} worker key(s)")

    def apply(self, socket: zmq.Socket, endpoint: str) -> None:
        if self._pair is not None:
            socket.curve_publickey, socket.curve_secretkey = self._pair
            socket.curve_server = True
        elif not is_loopback(endpoint):
            log.warning("binding %s without CURVE: anyone who can reach it can submit requests, and"
                        " register as a worker to read every prompt; see `ovpool keys generate`", endpoint)

    def secure_pair(self, publisher: zmq.Socket, subscriber: zmq.Socket) -> None:
        """A standby pair's state link (before bind and connect). Both brokers hold the one key
        pair their clients know: ``publisher`` is a CURVE server only that key may read, and
        ``subscriber`` takes states only from a server proving it holds that key, so no process
        without the secret can get a state to the FSM. Without CURVE both stay in the clear."""
        if self._pair is None:
            return
        for socket in (publisher, subscriber):
            socket.curve_publickey, socket.curve_secretkey = self._pair
        publisher.curve_server = True
        publisher.zap_domain = PAIR_DOMAIN.encode()
        subscriber.curve_serverkey = self._pair[0]

    def __exit__(self, *exc: object) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


# The ZAP domain of a standby pair's state socket: its own allowed keys, apart from the router's.
PAIR_DOMAIN = "ovpool-standby"
# The broker's allowed-key directories, in the order roles.by_key takes them.
_ALLOWED = {"curve_allowed_keys": "clients' (the HTTP API is a client)", "curve_worker_keys": "workers'"}


def _public_keys(settings: Settings, name: str) -> list[str]:
    """The z85 public keys in directory setting ``name``; a ConfigError says what it must hold."""
    directory = settings[name]
    if not directory or not Path(directory).is_dir():
        raise ConfigError(f"CURVE needs {name}: a directory of the {_ALLOWED[name]} public .key files"
                          f" (`ovpool keys generate`), got {directory!r}")
    try:
        return [key.decode("ascii") for key in zmq.auth.load_certificates(directory)]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the public keys in {name} {directory}: {exc}") from exc


class _AllowedKeys:
    """zmq.auth's credentials provider: a z85 public key in ``allowed`` may connect."""

    def __init__(self, allowed: Container[str]):
        self._allowed = allowed

    def callback(self, domain: str, key: bytes) -> bool:
        return key.decode("ascii") in self._allowed


def is_loopback(endpoint: str) -> bool:
    """Whether ``endpoint`` is reachable only from this host (ipc, inproc, or a loopback tcp address)."""
    parts = urlsplit(endpoint)
    if parts.scheme in ("ipc", "inproc"):
        return True
    host = (parts.hostname or "").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", an interface name or a host name: may be reachable from outside


# Socket-monitor events a client watches to learn whether the broker accepts it.
HANDSHAKE_EVENTS = int(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                       | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_SUCCEEDED)


class HandshakeWatch:
    """Whether the broker refuses this peer, from its socket-monitor events; remembered.

    A refusal must be remembered: the first handshake runs at connect time, usually before any
    request exists, and libzmq does not retry after an AUTH or PROTOCOL failure. A plain client
    meeting a CURVE broker sometimes sees NO_DETAIL instead (EPIPE: the broker closed first) and
    then retries; a broker dying mid-handshake looks the same once, so only a repeat counts.
    """

    def __init__(self, broker: str):
        self.broker = broker
        self.refused: AuthenticationError | None = None
        self._unexplained = 0

    def on_event(self, event: dict) -> AuthenticationError | None:
        kind = event["event"]
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.refused, self._unexplained = None, 0
        elif kind != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            self.refused = handshake_error(event, self.broker)
        else:
            self._unexplained += 1
            if self._unexplained >= 2:
                self.refused = handshake_error(event, self.broker)
        return self.refused


def handshake_error(event: dict, broker: str) -> AuthenticationError:
    """The error for a failed handshake (``zmq.utils.monitor.recv_monitor_message`` output)."""
    if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return AuthenticationError(
            f"the broker at {broker} refused this peer's CURVE key; add its public .key file to the"
            " broker's curve_allowed_keys directory (a client) or curve_worker_keys (a worker)")
    return AuthenticationError(
        f"security handshake with {broker} failed ({event['value']}): is CURVE configured on both"
        " sides (curve_secret_key and curve_server_key here)?")

