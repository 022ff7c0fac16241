"""Closed by default: a process of another local user cannot join a pool run with PoolKeys (it
cannot read the keys, and the broker refuses its own), while against an open broker the same
process receives a pending user's prompt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import zmq.auth

from ovpool.client import Client
from ovpool.pool_keys import PoolKeys
from ovpool.settings import REGISTRY
from ovpool.testing.pool import broker, fast_heartbeats, free_endpoint, null_worker, wait_for_workers

HOSTILE = Path(__file__).with_name("hostile_peer.py")
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def another_user_possible():
    if os.geteuid() != 0:
        why = "running a peer as another local user needs root (it switches to uid 65534)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(autouse=True)
def slow_heartbeats():
    """A request for a model no worker serves yet waits BROKER_GRACE_S (5 expiries, here 75 s),
    time enough for the hostile peer to try everything while it is pending."""
    with fast_heartbeats(5.0):
        yield


def _hostile(endpoint: str, server_key: bytes, *files: str) -> dict:
    out = subprocess.run([sys.executable, str(HOSTILE), endpoint, server_key.decode(), *files],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["uid"] == [65534] * 3
    return report


def _env(settings: dict[str, str]) -> dict[str, str]:
    """Settings as a child's environment: the secrets stay files, off every command line."""
    return {REGISTRY[name].env: value for name, value in settings.items()}


def test_an_open_broker_gives_another_users_worker_the_prompts():
    endpoint = free_endpoint()
    with broker(endpoint), Client(endpoint) as client:
        wait_for_workers(client, 0)  # the broker is up
        client.submit("a user's secret", model="m", max_tokens=1)
        report = _hostile(endpoint, zmq.curve_keypair()[0])
    assert report["no keys"] == {"handshake": "succeeded", "requests": ["a user's secret"]}


def test_another_local_user_cannot_join_a_pool_run_with_pool_keys():
    endpoint = free_endpoint()
    with PoolKeys() as keys, broker(endpoint, env=_env(keys.broker_settings())), \
            Client(endpoint, settings=keys.client_settings()) as client:
        wait_for_workers(client, 0)
        pending = client.submit("a user's secret", model="m", max_tokens=1)
        secrets = [keys.worker_settings()["curve_secret_key"], keys.client_settings()["curve_secret_key"]]
        broker_public = zmq.auth.load_certificate(keys.worker_settings()["curve_server_key"])[0]
        report = _hostile(endpoint, broker_public, *secrets)
        assert report["files"] == ["denied", "denied"] and report["stolen keys"] == []
        assert report["no keys"]["handshake"] == "failed" and report["own keys"]["handshake"] == "key refused"
        assert report["no keys"]["requests"] == report["own keys"]["requests"] == []
        assert not pending.done(), pending.exception()
        with null_worker(endpoint, model="m", env=_env(keys.worker_settings())):
            status = wait_for_workers(client, 1)
            assert pending.result(timeout=60).usage.completion_tokens == 1  # the pool's own worker
    assert [w["models"] for w in status["workers"]] == [["m"]]
