"""Serve's port checks and a service's readiness: the listener on the port must be its child's own."""

from __future__ import annotations

import sys

import pytest
from serve_helpers import free_port, taken_port, wait_for

from ovpool.errors import ConfigError
from ovpool.serve import ports
from ovpool.serve.service import Service
from ovpool.serve.supervisor import RestartPolicy

LISTENER = [sys.executable, "-c", "import socket, sys, time; s = socket.socket(); "
            "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('up', flush=True); time.sleep(600)"]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture(name="listening")
def _listening():
    with taken_port() as port:
        yield port


def test_owns_listener_tells_the_process_holding_the_port(listening):
    import os

    assert ports.owns_listener(os.getpid(), listening)
    assert not ports.owns_listener(os.getpid(), free_port())  # bound by nobody now
    assert not ports.owns_listener(1, listening)


def test_a_child_is_not_ready_while_another_server_answers_on_its_port(listening):
    """The finding: a connect check was answered by the other server and 'ready' logged."""
    service = Service("http", "test API", SLEEPER, f"127.0.0.1:{listening}", None, RestartPolicy())
    try:
        for now in range(20):  # the child runs but never listens: never ready, however often asked
            service.poll(float(now))
        assert service.describe()["state"] == "starting"
    finally:
        service.stop()


def test_a_child_listening_on_its_port_becomes_ready():
    port = free_port()
    service = Service("http", "test API", [*LISTENER, str(port)], f"127.0.0.1:{port}", None,
                      RestartPolicy())
    try:
        wait_for(lambda: service.poll(0.0) or service.ready, 30, "the listening child to be ready")
        assert ports.owns_listener(service.describe()["pid"], port)
    finally:
        service.stop()
    assert service.describe()["state"] == "stopped"


def test_taken_ports_are_config_errors_naming_the_address(listening):
    with pytest.raises(ConfigError, match=f"127.0.0.1:{listening}: Address already in use"):
        ports.check_http(f"127.0.0.1:{listening}")
    with pytest.raises(ConfigError, match=f"tcp://127.0.0.1:{listening}: Address already in use"):
        ports.check_broker(f"tcp://127.0.0.1:{listening}")
    free = free_port()
    ports.check_broker(f"tcp://127.0.0.1:{free}")
    ports.check_http(f"127.0.0.1:{free}")  # released by the broker check: the child can take it


@pytest.mark.parametrize("address, port", [("tcp://127.0.0.1:5555", 5555), ("tcp://*:80", 80),
                                           ("ipc:///tmp/x", None), ("[::1]:8000", 8000),
                                           ("127.0.0.1:8000", 8000)])
def test_tcp_port(address, port):
    assert ports.tcp_port(address) == port
