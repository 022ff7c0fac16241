"""A pool's own CURVE keys for one run (``ovpool serve``: closed by default).

Secrets stay in files: what a child process gets is a path to a 0600 file in a 0700 directory,
never a key on its command line.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ovpool.auth import generate, load_key
from ovpool.errors import ConfigError
from ovpool.settings import variable


class PoolKeys:
    """One pool's own CURVE keys for one run: ``with PoolKeys() as keys:`` makes a private directory
    (0700, secrets 0600) holding a broker, a worker and a client key pair, the broker allowing the
    worker key as a worker and the client key as a client; the directory is removed on exit.
    Another local user cannot read it, so cannot connect. ``parent``: where it goes (default
    $XDG_RUNTIME_DIR when usable, else the system temp dir). ``broker_secret_key`` (a file): the
    broker pair to use instead of a fresh one, for peers on other hosts that hold its public key;
    ``allowed_keys`` / ``worker_keys``: directories of those peers' public keys, allowed too.
    """

    def __init__(self, parent: str | Path | None = None, *, broker_secret_key: str = "",
                 allowed_keys: str = "", worker_keys: str = ""):
        self._parent, self._broker = parent, broker_secret_key
        self._extra = {"clients": ("curve_allowed_keys", allowed_keys),
                       "workers": ("curve_worker_keys", worker_keys)}
        self.path: Path | None = None

    def __enter__(self) -> PoolKeys:
        try:
            self.path = Path(tempfile.mkdtemp(prefix="ovpool-keys-", dir=_runtime_dir(self._parent)))
        except OSError as exc:
            raise ConfigError(f"cannot make a private key directory in {self._parent}: {exc}") from exc
        try:
            self._write(self.path)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _write(self, path: Path) -> None:
        for name in ("worker", "client"):
            generate(path, f"pool-{name}")
        if self._broker:
            public = load_key(self._broker, need_secret=True)[0].decode("ascii")
            (path / "pool-broker.key").write_text(f'curve\n    public-key = "{public}"\n')
        else:
            generate(path, "pool-broker")
        for sub, name in (("clients", "client"), ("workers", "worker")):
            (path / sub).mkdir(mode=0o700)
            _copy_public_keys(*self._extra[sub], path / sub)
            shutil.copy(path / f"pool-{name}.key", path / sub)

    def broker_settings(self) -> dict[str, str]:
        secret = self._broker or str(self.path / "pool-broker.key_secret")
        return {"curve_secret_key": secret, "curve_allowed_keys": str(self.path / "clients"),
                "curve_worker_keys": str(self.path / "workers")}

    def worker_settings(self) -> dict[str, str]:
        return self._peer("worker")

    def client_settings(self) -> dict[str, str]:
        """For clients of the pool: the HTTP API, `ovpool serve`'s own status client."""
        return self._peer("client")

    def _peer(self, name: str) -> dict[str, str]:
        return {"curve_secret_key": str(self.path / f"pool-{name}.key_secret"),
                "curve_server_key": str(self.path / "pool-broker.key")}

    def __exit__(self, *exc: object) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


def _runtime_dir(parent: str | Path | None) -> str | None:
    """``parent``, else $XDG_RUNTIME_DIR when it is this user's and writable, else None (tempfile's)."""
    if parent is not None:
        return str(parent)
    runtime = variable("XDG_RUNTIME_DIR")
    if not runtime:
        return None
    try:
        usable = os.stat(runtime).st_uid == os.getuid() and os.access(runtime, os.W_OK | os.X_OK)
    except OSError:
        usable = False
    return runtime if usable else None


def _copy_public_keys(setting: str, source: str, target: Path) -> None:
    if not source:
        return
    if not Path(source).is_dir():
        raise ConfigError(f"{setting} {source}: not a directory of public .key files")
    for key in Path(source).glob("*.key"):
        shutil.copy(key, target / key.name)
