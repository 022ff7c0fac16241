"""Roles under CURVE: a client key can submit but never register as a worker, a worker key can
serve but never submit (broker/roles.py, applied by broker/server.py before the router)."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest
import zmq

from ovpool import errors
from ovpool.auth import secure_peer
from ovpool.broker import roles
from ovpool.broker.server import Broker
from ovpool.client import Client
from ovpool.completion import Completion, Usage
from ovpool.config import BrokerConfig
from ovpool.pool_keys import PoolKeys
from ovpool.protocol import (
    Cancel,
    Credit,
    Disconnect,
    Error,
    Final,
    Heartbeat,
    LoadFailed,
    Partial,
    Ping,
    Ready,
    Request,
    Status,
    Submit,
    Supervised,
    decode,
    encode,
)
from ovpool.settings import Settings
from ovpool.testing.pool import fast_heartbeats, null_worker, wait_for_workers

CLIENT_COMMANDS = (Submit, Cancel, Credit)
WORKER_COMMANDS = (Ready, Heartbeat, Partial, Final, Error, Disconnect, LoadFailed)
EITHER = (Status, Ping, Supervised)


def _config(keys: PoolKeys) -> BrokerConfig:
    return BrokerConfig.from_values(keys.broker_settings())


def test_each_role_sends_only_its_own_commands():
    for command in CLIENT_COMMANDS:
        assert roles.allows(roles.CLIENT, command) and not roles.allows(roles.WORKER, command)
    for command in WORKER_COMMANDS:
        assert roles.allows(roles.WORKER, command) and not roles.allows(roles.CLIENT, command)
    for command in (*CLIENT_COMMANDS, *WORKER_COMMANDS, *EITHER):
        assert roles.allows(roles.ANY, command) and not roles.allows(0, command)
    for command in EITHER:  # `ovpool serve` on a worker host reads the status with its worker key
        assert roles.allows(roles.CLIENT, command) and roles.allows(roles.WORKER, command)


def test_a_key_in_both_directories_holds_both_roles():
    assert roles.by_key(["a", "b"], ["b", "c"]) == {"a": roles.CLIENT, "b": roles.ANY, "c": roles.WORKER}


def test_a_refusal_names_the_command_and_the_directory_the_key_belongs_in():
    why = roles.refusal(roles.CLIENT, LoadFailed)
    assert "a client's" in why and "LOAD_FAILED" in why and "curve_worker_keys" in why
    why = roles.refusal(roles.WORKER, Submit)
    assert "a worker's" in why and "SUBMIT" in why and "curve_allowed_keys" in why


@pytest.fixture
def keys(tmp_path):
    with PoolKeys(tmp_path) as pool:
        yield pool


@pytest.fixture
def curve_broker(keys):
    """An in-process broker with the pool's keys, on a free loopback port; slow heartbeats, so a
    hand-driven worker that sends none stays registered for the whole test."""
    stop = threading.Event()
    with fast_heartbeats(5.0), Broker("tcp://127.0.0.1:0", _config(keys)) as broker:
        thread = threading.Thread(target=broker.serve, args=(stop,))
        thread.start()
        try:
            yield broker.endpoint
        finally:
            stop.set()
            thread.join()


class RawPeer:
    """A DEALER speaking the wire protocol by hand, with the CURVE settings it is given."""

    def __init__(self, context: zmq.Context, endpoint: str, settings: dict):
        self.socket = context.socket(zmq.DEALER)
        self.socket.linger = 0
        secure_peer(self.socket, Settings.resolve(settings))
        self.socket.connect(endpoint)

    def send(self, msg) -> None:
        self.socket.send_multipart(encode(msg))

    def recv(self, timeout_s: float = 20.0):
        """The next message other than a broker HEARTBEAT; TimeoutError after ``timeout_s``."""
        while self.socket.poll(timeout_s * 1000):
            msg = decode(self.socket.recv_multipart())
            if not isinstance(msg, Heartbeat):
                return msg
        raise TimeoutError(f"nothing from the broker in {timeout_s} s")

    def pending(self) -> list:
        """What the broker sent that has not been read, without waiting."""
        out = []
        while self.socket.poll(0):
            out.append(decode(self.socket.recv_multipart()))
        return [m for m in out if not isinstance(m, Heartbeat)]


def _ready(worker_id: str, slots: int) -> Ready:
    return Ready(worker_id, ["m"], "CPU", slots, "host", os.getpid())


def _final(request_id: str) -> Final:
    return Final(request_id, Completion("ok", [1], "length", Usage(1, 1)).to_dict())


def test_a_client_key_cannot_register_as_a_worker(keys, curve_broker, caplog):
    context = zmq.Context()
    try:
        with Client(curve_broker, settings=keys.client_settings()) as client:
            worker = RawPeer(context, curve_broker, keys.worker_settings())
            worker.send(_ready("real", slots=1))
            wait_for_workers(client, 1)
            first = client.submit("one", model="m", max_tokens=1)
            assert isinstance(running := worker.recv(), Request)
            second = client.submit("two", model="m", max_tokens=1)  # waits: the one slot is busy
            impostor = RawPeer(context, curve_broker, keys.client_settings())
            impostor.send(_ready("impostor", slots=64))
            refused = impostor.recv()
            assert isinstance(refused, Error) and refused.code == errors.AuthenticationError.code
            assert "READY" in refused.message and "curve_worker_keys" in refused.message
            impostor.send(Heartbeat())
            assert "HEARTBEAT" in impostor.recv().message
            impostor.send(_ready("impostor", slots=64))
            assert "READY" in impostor.recv().message
            assert caplog.text.count("refused a Ready") == 1  # once per kind of key and command
            status = client.status()
            assert [w["id"] for w in status["workers"]] == ["real"] and status["queues"] == {"m": 1}
            worker.send(_final(running.request_id))
            assert isinstance(queued := worker.recv(), Request)  # the waiting one went to the real worker
            worker.send(_final(queued.request_id))
            assert first.result(timeout=20).text == "ok" and second.result(timeout=20).text == "ok"
            assert impostor.pending() == []
    finally:
        context.destroy(linger=0)


def test_a_worker_key_cannot_submit(keys, curve_broker):
    # A CURVE handshake beside busy processes can take longer than the 2 s default.
    patient = {**keys.worker_settings(), "connect_timeout_s": 60}
    with Client(curve_broker, settings=patient) as as_worker, \
            pytest.raises(errors.AuthenticationError, match="a worker's.*SUBMIT.*curve_allowed_keys"):
        as_worker.complete("hi", model="m", max_tokens=1)
    with Client(curve_broker, settings=keys.client_settings()) as client:
        status = wait_for_workers(client, 0)
    assert status["queues"] == {} and status["counters"]["submitted"] == 0


def test_the_broker_logs_its_mode(keys, caplog):
    with caplog.at_level(logging.INFO), Broker("tcp://127.0.0.1:0", _config(keys)):
        pass
    assert "CURVE with roles: 1 client key(s), 1 worker key(s)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO), Broker("tcp://127.0.0.1:0"):
        pass
    assert "open: no CURVE" in caplog.text


def test_curve_without_a_worker_directory_is_a_clear_error(keys):
    settings = {**keys.broker_settings(), "curve_worker_keys": ""}
    with pytest.raises(errors.ConfigError, match="CURVE needs curve_worker_keys"), \
            Broker("tcp://127.0.0.1:0", BrokerConfig.from_values(settings)):
        pass
    with pytest.raises(errors.ConfigError, match="curve_worker_keys needs curve_secret_key"):
        Broker("tcp://127.0.0.1:0", BrokerConfig(curve_worker_keys=_config(keys).curve_worker_keys))


def test_a_worker_started_with_a_client_key_says_why_it_never_serves(keys, curve_broker, tmp_path):
    """The broker refuses its READY; without the worker's own error line only the broker's log
    would say why it never serves."""
    log = tmp_path / "worker.log"
    env = {f"OVPOOL_{k.upper()}": v for k, v in keys.client_settings().items()}
    with null_worker(curve_broker, env=env, log=log):
        deadline = time.monotonic() + 60
        while "the broker refused this worker" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
    assert "curve_worker_keys" in log.read_text()
