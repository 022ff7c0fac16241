"""PoolKeys: a pool's own CURVE keys for one run, private to this user and gone afterwards."""

from __future__ import annotations

import stat
import tempfile

import pytest
import zmq.auth

from ovpool import errors
from ovpool.auth import generate
from ovpool.pool_keys import PoolKeys


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_keys_are_private_to_this_user_and_removed_on_exit(tmp_path):
    with PoolKeys(tmp_path) as keys:
        path = keys.path
        assert path.parent == tmp_path and _mode(path) == 0o700
        assert sorted(p.name for p in path.glob("*.key_secret")) == [
            "pool-broker.key_secret", "pool-client.key_secret", "pool-worker.key_secret"]
        assert {_mode(p) for p in path.glob("*.key_secret")} == {0o600}
        assert [p.name for p in (path / "clients").iterdir()] == ["pool-client.key"]
        assert [p.name for p in (path / "workers").iterdir()] == ["pool-worker.key"]
        assert {_mode(path / "clients"), _mode(path / "workers")} == {0o700}
        broker, worker, client = keys.broker_settings(), keys.worker_settings(), keys.client_settings()
    assert not path.exists() and list(tmp_path.iterdir()) == []
    assert broker == {"curve_secret_key": str(path / "pool-broker.key_secret"),
                      "curve_allowed_keys": str(path / "clients"), "curve_worker_keys": str(path / "workers")}
    assert worker == {"curve_secret_key": str(path / "pool-worker.key_secret"),
                      "curve_server_key": str(path / "pool-broker.key")}
    assert client["curve_secret_key"] == str(path / "pool-client.key_secret")


def test_the_directory_goes_to_the_runtime_directory_when_it_is_usable(tmp_path, monkeypatch):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    with PoolKeys() as keys:
        assert keys.path.parent == runtime
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    with PoolKeys() as keys:
        assert str(keys.path.parent) == tempfile.gettempdir()


def test_a_given_broker_pair_and_other_hosts_keys_join_the_pool(tmp_path):
    broker_public, broker_secret = generate(tmp_path / "mine", "broker")
    for name, directory in (("laptop", "clients"), ("gpu-host", "workers")):
        generate(tmp_path / directory, name)
    with PoolKeys(tmp_path, broker_secret_key=str(broker_secret), allowed_keys=str(tmp_path / "clients"),
                  worker_keys=str(tmp_path / "workers")) as keys:
        assert keys.broker_settings()["curve_secret_key"] == str(broker_secret)
        served = zmq.auth.load_certificate(keys.worker_settings()["curve_server_key"])[0]
        assert served == zmq.auth.load_certificate(broker_public)[0]
        for directory, theirs in (("clients", "laptop.key"), ("workers", "gpu-host.key")):
            assert sorted(p.name for p in (keys.path / directory).iterdir()) == sorted(
                [theirs, f"pool-{directory[:-1]}.key"])
        assert not (keys.path / "pool-broker.key_secret").exists()


def test_a_bad_directory_is_a_clear_error_and_leaves_nothing_behind(tmp_path):
    parent = tmp_path / "parent"
    parent.mkdir()
    with pytest.raises(errors.ConfigError, match="not a directory of public .key files"), \
            PoolKeys(parent, worker_keys=str(tmp_path / "nowhere")):
        pass
    assert list(parent.iterdir()) == []
    with pytest.raises(errors.ConfigError, match="cannot make a private key directory"), \
            PoolKeys(tmp_path / "nowhere"):
        pass
