"""``ovpool api``: the HTTP API's process, the Starlette app on uvicorn.

uvicorn with httptools (a C HTTP parser) and uvloop: the same stack vLLM serves its OpenAI API
on. The listening socket is bound here first, so a taken port is one clear error line.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import threading
import time
from typing import Any

from ovpool import gc_policy, timing
from ovpool.api.app import Config, create_app
from ovpool.errors import BrokerUnavailableError, ConfigError, DrainingError


def parse_bind(bind: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8000`` for IPv6) as (host, port)."""
    host, sep, port = bind.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"HTTP bind {bind!r}: expected HOST:PORT, e.g. 127.0.0.1:8000 or [::]:8000")
    return host, int(port)


def listen(bind: str) -> socket.socket:
    host, port = parse_bind(bind)
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET  # a host name such as localhost
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"the HTTP API cannot listen on {bind}: {exc.strerror}; pick another "
                          "--bind (serve: --http)") from exc
    sock.set_inheritable(True)
    return sock


def run(config: Config, bind: str, stop: threading.Event) -> None:
    """Serve until ``stop`` is set, then drain: readiness and new requests answer 503 (with
    Retry-After) while the requests in flight get ``config.shutdown_timeout_s`` to finish; those
    still open then fail with DrainingError (an error event on a stream), never a cut connection.

    uvicorn runs on a thread of its own, where it leaves signals alone: the CLI's SIGTERM
    handling (stop_on_signals) stays the same as the broker's and the workers', exit status 0.
    """
    import uvicorn  # not for `ovpool serve`, which only checks the bind

    from ovpool.api.one_write import Http
    from ovpool.api.peer_bounds import connection_cap

    config.keys.warn_if_open(parse_bind(bind)[0])
    http = functools.partial(Http, cap=connection_cap(config.max_connections))
    sock = listen(bind)
    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(
        app, loop="uvloop", http=http, lifespan="on", log_config=None,
        access_log=False, proxy_headers=False,
        timeout_graceful_shutdown=max(1, round(timing.SHUTDOWN_GRACE_S))))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn")
    gc_policy.settle()  # the app and its imports are built: a request's objects are what is left
    with sock:
        thread.start()
        while thread.is_alive() and not stop.wait(timing.POLL_INTERVAL_S):
            if getattr(app.state, "link_lost", ""):
                break
        if thread.is_alive() and not getattr(app.state, "link_lost", ""):
            _drain(app.state.api, config.shutdown_timeout_s, server.started)
        server.should_exit = True
        thread.join()
    if getattr(app.state, "link_lost", ""):
        raise BrokerUnavailableError(f"the HTTP API's broker client stopped ({app.state.link_lost});"
                                     " this process exits so that a fresh one serves")
    if not server.started:
        raise ConfigError(f"the HTTP API on {bind} did not start; see the log above")


def _drain(api: Any, timeout_s: float, started: bool) -> None:
    """Refuse new requests, wait for those in flight (up to ``timeout_s``), then fail the rest."""
    api.draining = True
    deadline = time.monotonic() + timeout_s
    while started and api.in_flight > 0 and time.monotonic() < deadline:
        time.sleep(timing.POLL_INTERVAL_S)
    if api.in_flight > 0 and api.client is not None:
        api.loop.call_soon_threadsafe(api.client.give_up, DrainingError(
            f"this HTTP API stopped before the request finished: its drain's timeout of {timeout_s:g} s "
            "(setting shutdown_timeout_s) ended; send it again"))
        time.sleep(timing.POLL_INTERVAL_S)  # the error events go out before uvicorn closes
