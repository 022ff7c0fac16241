"""The broker's ``/metrics`` HTTP endpoint, bounded against its peers: prometheus_client's own
server gives every connection a thread for as long as it stays open, so idle connections held
threads in the broker for ever (300 of them: 300 threads) and, enough of them, every process id
of the host. Here a connection that sends nothing for SCRAPE_TIMEOUT_S gives its thread back and
at most MAX_SCRAPES are served at once (one more is closed at once: a scrape takes milliseconds).
"""

from __future__ import annotations

import socket
import sys
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app

from ovpool.errors import ConfigError

MAX_SCRAPES = 16
SCRAPE_TIMEOUT_S = 10.0


class _Handler(WSGIRequestHandler):
    timeout = SCRAPE_TIMEOUT_S  # the connection's socket timeout: a silent peer ends its request

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base's name)
        pass  # scrapes (and peers that time out) are not news in the broker's log


class _BoundedServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 made a burst of connections retry their SYNs for seconds

    def __init__(self, address: tuple[str, int], family: int):
        self.address_family = family
        self._slots = threading.BoundedSemaphore(MAX_SCRAPES)
        super().__init__(address, _Handler)

    def process_request(self, request, client_address) -> None:  # noqa: ANN001 (socketserver's)
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the cap: closed, no thread
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:  # noqa: ANN001
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001
        """A peer that timed out or left is not a traceback on stderr (socketserver's default)."""
        if not isinstance(sys.exc_info()[1], OSError):  # TimeoutError and ConnectionError are
            super().handle_error(request, client_address)


class MetricsServer:
    """The ``/metrics`` HTTP endpoint of one registry, on a background thread; a context manager."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str = "0.0.0.0"):
        self._registry, self._port, self._host = registry, port, host
        self._server: _BoundedServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0: the OS picks a free one)."""
        assert self._server is not None, "MetricsServer is not started"
        return self._server.server_port

    def __enter__(self) -> MetricsServer:
        try:
            family = socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)[0][0]
            self._server = _BoundedServer((self._host, self._port), family)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {self._host}:{self._port}: {exc}; "
                              "pick another --metrics-port (0 turns metrics off)") from exc
        self._server.set_app(make_wsgi_app(self._registry))
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = None
