"""The ZeroMQ endpoints ovpool binds and connects, checked before anything heavy starts.

libzmq reports a malformed endpoint only when a socket binds or connects it, as a bare
``ZMQError: Invalid argument``: a worker would load its model first (seconds) and then die with a
traceback. ``check`` names the endpoint and the forms accepted, and ``translate`` turns the
ZMQError of a bind or connect that still fails into the same ConfigError.
"""

from __future__ import annotations

import re

import zmq

from ovpool.errors import ConfigError

FORMS = "tcp://HOST:PORT (e.g. tcp://127.0.0.1:5555) or ipc://PATH (e.g. ipc:///tmp/ovpool.sock)"
# HOST: a name, an IPv4 address, [an IPv6 address] or * (any interface, binding only).
_TCP = re.compile(r"tcp://(?P<host>\[[0-9A-Fa-f:.%\w]+\]|[\w.*-]+):(?P<port>\d+|\*)")


def check(endpoint: str, what: str = "broker endpoint", many: bool = True) -> str:
    """``endpoint`` unchanged if it is one ZeroMQ can bind or connect (with ``many``, or a
    comma-separated list of them: a standby broker pair), else a ConfigError that says which of
    ``what`` is wrong and the accepted forms (the inproc:// of tests passes too)."""
    text = endpoint if isinstance(endpoint, str) else repr(endpoint)
    parts = split(text) if many and "," in text else [text]
    problem = next((p for p in map(_problem, parts) if p), "") if parts else "no endpoint in the list"
    if problem:
        raise ConfigError(f"{what} {text!r} is not valid ({problem}); use {FORMS}")
    return endpoint


def split(endpoints: str) -> list[str]:
    """The endpoints of a comma-separated list (``tcp://a:5555,tcp://b:5555``: a standby pair)."""
    return [e.strip() for e in endpoints.split(",") if e.strip()]


def _problem(endpoint: str) -> str:
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        return "no scheme"
    if scheme in ("ipc", "inproc"):
        return "" if rest else "no path"
    if scheme != "tcp":
        return f"scheme {scheme!r} is not tcp or ipc"
    match = _TCP.fullmatch(endpoint)
    if match is None:
        return "expected HOST:PORT after tcp://"
    port = match["port"]
    if port != "*" and not 0 <= int(port) <= 65535:
        return f"port {port} is outside 0..65535"
    return ""


def translate(exc: zmq.ZMQError, action: str, endpoint: str) -> ConfigError:
    """The ConfigError for a bind or connect (``action``) of ``endpoint`` that libzmq refused."""
    hint = {zmq.EADDRINUSE: "another process listens there; stop it or pick another port",
            zmq.EADDRNOTAVAIL: "this host has no such address",
            zmq.EINVAL: f"use {FORMS}"}.get(exc.errno, f"use {FORMS}")
    return ConfigError(f"cannot {action} {endpoint}: {exc.strerror}; {hint}")
