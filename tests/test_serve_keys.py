"""`ovpool serve` is closed by default: only its own processes join its broker. Another local
user's process cannot read the pool's keys and is refused as a worker; a plain client is refused;
the HTTP API (a client key) and this user's tools (keys named by the 0600 state file) work.
CURVE across hosts works from serve's own flags, and a flag that does not fit is one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import zmq.auth
from serve_helpers import run_serve, serve

from ovpool import errors
from ovpool.auth import generate
from ovpool.client import Client
from ovpool.serve.keys import child_keys
from ovpool.settings import Settings
from ovpool.testing.pool import fast_heartbeats, free_endpoint, wait_for_workers

HOSTILE = Path(__file__).with_name("hostile_peer.py")
NULL = ("--backend", "null", "--workers", "1")


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if b"=" in item)


def _hostile(endpoint: str, server_key: bytes, *files: str) -> dict:
    out = subprocess.run([sys.executable, str(HOSTILE), endpoint, server_key.decode(), *files],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["uid"] == [65534] * 3
    return report


@pytest.mark.slow
def test_another_local_user_cannot_join_a_closed_serve_and_its_own_processes_can(tmp_path):
    if os.geteuid() != 0:
        why = "running a peer as another local user needs root (it switches to uid 65534)"
        pytest.fail(why) if os.environ.get("CI", "").lower() == "true" else pytest.skip(why)
    # 5 s heartbeats: a request for a model no worker serves waits 5 expiries (75 s) for one,
    # time enough for the hostile peer to try everything while that request is pending.
    with fast_heartbeats(5.0), serve(tmp_path, *NULL, http=True, closed=True,
                                     env={"OVPOOL_HEARTBEAT_INTERVAL_S": "5.0"}) as served, \
            served.client() as client:
        (worker,) = served.wait_states("ready", timeout=120).values()
        pending = client.submit("a user's secret", model="m", max_tokens=1)
        worker_key = _environ(worker["pid"])["OVPOOL_CURVE_SECRET_KEY"]
        keys = served.client_keys()
        broker_public = zmq.auth.load_certificate(keys["curve_server_key"])[0]
        report = _hostile(served.endpoint, broker_public, worker_key, keys["curve_secret_key"])
        assert report["files"] == ["denied", "denied"] and report["stolen keys"] == []
        assert report["no keys"] == {"handshake": "failed", "requests": []}
        assert report["own keys"] == {"handshake": "key refused", "requests": []}
        assert not pending.done(), pending.exception()
        with Client(served.endpoint, settings={"connect_timeout_s": 60}) as plain, \
                pytest.raises(errors.AuthenticationError):
            plain.complete("hi", max_tokens=1)
        _own_tools_work(served, keys)


def _own_tools_work(served, keys: dict[str, str]) -> None:
    """The HTTP API child holds a client key; this user's `ovpool status` takes the state file's."""
    body = json.dumps({"model": "smollm2", "prompt": "x", "max_tokens": 2}).encode()
    served.wait_service("http")
    request = urllib.request.Request(f"http://127.0.0.1:{served.http_port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert json.load(resp)["usage"]["completion_tokens"] == 2
    env = {**os.environ, "OVPOOL_CURVE_SECRET_KEY": keys["curve_secret_key"],
           "OVPOOL_CURVE_SERVER_KEY": keys["curve_server_key"]}
    status = subprocess.run([sys.executable, "-m", "ovpool", "status", "--json", "--broker", served.endpoint],
                            capture_output=True, text=True, timeout=60, env=env)
    assert status.returncode == 0, status.stderr
    assert [w["models"] for w in json.loads(status.stdout)["workers"]] == [["smollm2"]]


@pytest.fixture
def keys(tmp_path):
    """docs/operations.md's scaling-out keys: the broker's pair, client and worker keys by role."""
    directory = tmp_path / "keys"
    for name in ("broker", "worker", "client"):
        generate(directory, name)
    for sub, name in (("allowed", "client"), ("workers", "worker")):
        (directory / sub).mkdir()
        shutil.copy(directory / f"{name}.key", directory / sub)
    return directory


@pytest.mark.slow
def test_serve_with_curve_across_hosts_from_its_own_flags(tmp_path, keys):
    """Host A: serve's broker with the documented settings as environment variables, its own
    worker; host B: serve --broker with flags, a worker only. A client of B's keys sees both."""
    broker_env = {"OVPOOL_CURVE_SECRET_KEY": str(keys / "broker.key_secret"),
                  "OVPOOL_CURVE_ALLOWED_KEYS": str(keys / "allowed"),
                  "OVPOOL_CURVE_WORKER_KEYS": str(keys / "workers")}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with serve(tmp_path / "a", *NULL, closed=True, env=broker_env) as host_a, \
            serve(tmp_path / "b", *NULL, "--broker", host_a.endpoint, "--served-name", "remote-m",
                  "--curve-secret-key", str(keys / "worker.key_secret"),
                  "--curve-server-key", str(keys / "broker.key"), closed=True) as host_b, \
            Client(host_a.endpoint, settings={"curve_secret_key": str(keys / "client.key_secret"),
                                              "curve_server_key": str(keys / "broker.key")}) as client:
        host_a.wait_states("ready")
        host_b.wait_states("ready")
        status = wait_for_workers(client, 2)
        assert sorted(m for w in status["workers"] for m in w["models"]) == ["remote-m", "smollm2"]
        assert client.complete("hi", model="remote-m", max_tokens=2).usage.completion_tokens == 2
        assert client.complete("hi", model="smollm2", max_tokens=2).usage.completion_tokens == 2


@pytest.mark.parametrize("flags, named", [
    ({"curve_server_key": "b.key"}, "--curve-server-key is for joining a remote broker"),
])
def test_a_curve_flag_that_does_not_fit_a_local_broker_is_named(flags, named):
    with pytest.raises(errors.ConfigError, match=named), child_keys(Settings.resolve(flags, env={}), True):
        pass


@pytest.mark.parametrize("flags, named", [
    ({"curve_secret_key": "w.key_secret"}, "needs both --curve-secret-key"),
    ({"curve_allowed_keys": "allowed"}, "--curve-allowed-keys: for serve's own broker"),
    ({"curve_worker_keys": "w", "curve_allowed_keys": "a"}, "--curve-allowed-keys, --curve-worker-keys"),
])
def test_a_curve_flag_that_does_not_fit_joining_a_broker_is_named(flags, named):
    with pytest.raises(errors.ConfigError, match=named), child_keys(Settings.resolve(flags, env={}), False):
        pass


def test_open_with_keys_is_refused_and_open_alone_gives_no_keys():
    with pytest.raises(errors.ConfigError, match="--open runs without CURVE"), \
            child_keys(Settings.resolve({"curve_secret_key": "b.key_secret"}, env={}), True, open_pool=True):
        pass
    with child_keys(Settings.resolve({}, env={}), True, open_pool=True) as keys:
        assert keys.env("worker") == keys.env("client") == keys.env("broker") == {
            "OVPOOL_CURVE_SECRET_KEY": "", "OVPOOL_CURVE_SERVER_KEY": "", "OVPOOL_CURVE_ALLOWED_KEYS": "",
            "OVPOOL_CURVE_WORKER_KEYS": ""}


def test_closed_keys_give_each_role_its_own_pair_in_a_private_directory():
    with child_keys(Settings.resolve({}, env={}), True) as keys:
        worker, client = keys.worker["curve_secret_key"], keys.client["curve_secret_key"]
        assert worker != client and keys.worker["curve_server_key"] == keys.client["curve_server_key"]
        directory = Path(worker).parent
        assert directory.stat().st_mode & 0o777 == 0o700 and Path(worker).stat().st_mode & 0o777 == 0o600
        assert keys.broker["curve_worker_keys"] != keys.broker["curve_allowed_keys"]
    assert not directory.exists()


def test_serve_refuses_a_misfit_flag_before_any_child():
    done = run_serve("--bind", free_endpoint(), "--no-http", "--curve-server-key", "b.key", *NULL)
    assert done.returncode == 2 and done.stdout.startswith("error: --curve-server-key"), done.stdout
