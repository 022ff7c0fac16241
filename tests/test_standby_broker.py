"""A standby broker pair as real processes: kill -9 of the active broker under load, a paused
(SIGSTOP) active broker whose peer takes over (a split-brain attempt), and a forger of peer states.

Clients and the worker know both endpoints (``--broker A,B``). Every stream is compared, token by
token, with the same request (same seed) completed before the fault: exactly once, nothing lost,
nothing repeated. Deadlines are generous; nothing is timed. The kill and pause tests run the pair
under the pool's CURVE keys (closed, as ``ovpool serve`` runs), the AsyncClient and HTTP ones open.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import zmq
from serve_helpers import wait_for
from zmq.utils.monitor import recv_monitor_message

from ovpool import errors
from ovpool.async_client import AsyncClient
from ovpool.broker.binary_star import State
from ovpool.client import Client
from ovpool.pool_keys import PoolKeys
from ovpool.protocol import PeerState, encode, send_frames
from ovpool.serve.keys import ChildKeys
from ovpool.settings import child_environment
from ovpool.testing.pool import PoolProcess, broker, fast_heartbeats, free_endpoint, null_worker

pytestmark = pytest.mark.slow  # processes

STREAMS, TOKENS = 8, 60
FORGED = "tcp://forged:1"


class Pair:
    """Two brokers, primary first, and their endpoints; ``both`` is what clients are given, and
    ``keys`` each role's CURVE settings (ChildKeys(): open)."""

    def __init__(self, tmp_path: Path, keys: ChildKeys):
        self.keys = keys
        self.primary_ep, self.backup_ep = free_endpoint(), free_endpoint()
        state_p, state_b = free_endpoint(), free_endpoint()
        env = keys.env("broker")
        self.primary = broker(self.primary_ep, "--role", "primary", "--peer", state_b, "--peer-bind", state_p,
                              env=env, log=tmp_path / "primary.log")
        self.backup = broker(self.backup_ep, "--role", "backup", "--peer", state_p, "--peer-bind", state_b,
                             env=env, log=tmp_path / "backup.log")
        self.both = f"{self.primary_ep},{self.backup_ep}"


@contextlib.contextmanager
def _pool_keys(tmp_path: Path) -> Iterator[ChildKeys]:
    """The pool's own CURVE keys for each role, as ``ovpool serve`` makes them (closed)."""
    with PoolKeys(tmp_path) as keys:
        yield ChildKeys(keys.broker_settings(), keys.worker_settings(), keys.client_settings())


@contextlib.contextmanager
def _serving(tmp_path: Path, keys: ChildKeys = ChildKeys()) -> Iterator[tuple[Pair, Client]]:
    """A pair under short heartbeats (the children read them when made), a null worker of
    STREAMS slots registered with its active broker, and a Client of both endpoints."""
    with fast_heartbeats(0.2):
        pair = Pair(tmp_path, keys)
        with pair.primary, pair.backup, \
                null_worker(pair.both, slots=STREAMS, token_delay=0.03, env=keys.env("worker"),
                            log=tmp_path / "worker.log"), \
                Client(pair.both, settings=keys.client) as client:
            _ready(client)
            yield pair, client


def _status_text(pair: Pair) -> str:
    out = subprocess.run([sys.executable, "-m", "ovpool", "status", "--broker", pair.both],
                         capture_output=True, text=True, timeout=60,
                         env=child_environment(pair.keys.env("client")))
    return out.stdout + out.stderr


def _active(pair: Pair, client: Client) -> str:
    """The first line of ``ovpool status`` for the pair, once it names an active broker. Each try
    follows a request, a client's vote: a broker demoted by a stall (below) serves again only at
    one, and STATUS is none."""

    def named() -> str | None:
        client.complete("a vote", max_tokens=1, timeout=60)
        return next((line for line in _status_text(pair).splitlines() if line.startswith("active broker:")),
                    None)

    return wait_for(named, timeout=60, what="an active broker")


def _stalls(endpoint: str, keys: ChildKeys) -> int:
    """How often the broker at ``endpoint`` found its own process had not run for 2 intervals
    (0.4 s here): a SIGSTOP, or an overloaded host's stall, which by design demotes an active
    broker (binary_star.py) and may hand the pair to its peer."""
    with Client(endpoint, settings=keys.client) as one:
        return one.status(timeout=30)["standby"]["stalls"]


def _submit_alone(endpoint: str, keys: ChildKeys) -> errors.OvpoolError | None:
    """What a client of ``endpoint`` alone gets for a request: its error, None when served."""
    with Client(endpoint, settings=keys.client) as alone:
        try:
            alone.complete("to one broker alone", max_tokens=5, timeout=30)
        except errors.OvpoolError as exc:
            return exc
    return None


def _ready(client: Client) -> None:
    """The pair has an active broker with the worker registered."""

    def registered() -> bool:
        try:
            return len(client.status(timeout=30)["workers"]) == 1
        except errors.BrokerUnavailableError:  # a broker still starting
            return False

    wait_for(registered, timeout=60, what="the worker")


def _references(client: Client) -> list[str]:
    return [client.complete(f"stream {i}", max_tokens=TOKENS, seed=i).text for i in range(STREAMS)]


def _streams(client: Client, started: threading.Barrier) -> tuple[list, list[threading.Thread]]:
    """STREAMS streams in threads; each result is (indices, text) or the error it ended with."""
    results: list = [None] * STREAMS

    def read(i: int) -> None:
        indices, text = [], ""
        try:
            for delta in client.stream(f"stream {i}", max_tokens=TOKENS, seed=i, timeout=120):
                indices.append(delta.index)
                text += delta.text
                if len(indices) == 3:
                    started.wait(timeout=60)
            results[i] = (indices, text)
        except (errors.OvpoolError, threading.BrokenBarrierError) as exc:
            results[i] = exc

    threads = [threading.Thread(target=read, args=(i,)) for i in range(STREAMS)]
    for t in threads:
        t.start()
    return results, threads


def _each_once(results: list, references: list[str]) -> None:
    for i, got in enumerate(results):
        assert not isinstance(got, BaseException), f"stream {i}: {got!r}"
        indices, text = got
        assert indices == list(range(TOKENS)), f"stream {i}"
        assert text == references[i]


@pytest.mark.parametrize("stop", ["kill", "stop"])
def test_kill_9_of_the_active_broker_loses_no_stream_and_status_names_the_backup(tmp_path, stop):
    """``kill``: SIGKILL; ``stop``: SIGTERM, whose broker hands its requests and worker over. The
    pair runs under the pool's CURVE keys, its state link too."""
    with _pool_keys(tmp_path) as keys, _serving(tmp_path, keys) as (pair, client):
        assert _active(pair, client) == f"active broker: {pair.primary_ep} (primary)"
        references = _references(client)
        started = threading.Barrier(STREAMS + 1)
        results, threads = _streams(client, started)
        started.wait(timeout=60)  # every stream is accepted and under way
        getattr(pair.primary, stop)()
        for t in threads:
            t.join(timeout=120)
        _each_once(results, references)
        assert _active(pair, client) == f"active broker: {pair.backup_ep} (backup)"
        assert client.complete("after", max_tokens=5).usage.completion_tokens == 5


def test_an_async_client_fails_over_mid_stream_too(tmp_path):
    """AsyncClient (the HTTP API's client) moves its socket to the backup without a lost token."""
    with _serving(tmp_path) as (pair, client):
        references = _references(client)

        async def run() -> list:
            async with AsyncClient(pair.both) as ac:
                started = asyncio.Event()
                counted = [0]

                async def read(i: int) -> tuple[list, str]:
                    indices, text = [], ""
                    async for delta in ac.stream(f"stream {i}", max_tokens=TOKENS, seed=i, timeout=120):
                        indices.append(delta.index)
                        text += delta.text
                        if len(indices) == 3:
                            counted[0] += 1
                            if counted[0] == STREAMS:
                                started.set()
                    return indices, text

                tasks = [asyncio.create_task(read(i)) for i in range(STREAMS)]
                await asyncio.wait_for(started.wait(), 60)
                pair.primary.kill()
                return await asyncio.gather(*tasks, return_exceptions=True)

        _each_once(asyncio.run(run()), references)


def _health(base: str) -> int:
    try:
        return httpx.get(f"{base}/health", timeout=30).status_code
    except httpx.TransportError:  # not listening yet
        return 0


def test_the_http_api_streams_through_a_failover(tmp_path):
    """``ovpool api --broker A,B``: an OpenAI stream goes on, token for token, past a kill -9."""
    port = int(free_endpoint().rsplit(":", 1)[1])
    with _serving(tmp_path) as (pair, client), \
            PoolProcess("api", "--broker", pair.both, "--bind", f"127.0.0.1:{port}",
                        log=tmp_path / "api.log"):
        (reference,) = [client.complete("stream 0", max_tokens=TOKENS, seed=0).text]
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _health(base) == 200, 60, "the HTTP API")
        sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
        text, chunks = "", 0
        for chunk in sdk.completions.create(model="null", prompt="stream 0", max_tokens=TOKENS, seed=0,
                                            stream=True):
            text += chunk.choices[0].text if chunk.choices else ""
            chunks += 1
            if chunks == 3:
                pair.primary.kill()
    assert text == reference


def test_a_paused_active_broker_never_serves_beside_its_peer(tmp_path):
    """SIGSTOP the active primary mid-stream: its clients and worker move to the backup, which the
    clients' votes make active; woken (SIGCONT), the primary counts its freeze, goes passive and
    stays so: the backup remains the one active, and the primary refuses a client that asks it
    alone. Under the pool's CURVE keys, as a closed pool runs. A loaded host may stall the backup
    too (a 0.5 s SIGSTOP of it after the wake failed this test every time): it then demotes itself
    by design and the pair may move to the primary, so who serves is asserted when the backup
    counted no stall of its own up to then; the streams are exact either way."""
    with _pool_keys(tmp_path) as keys, _serving(tmp_path, keys) as (pair, client):
        references = _references(client)
        started = threading.Barrier(STREAMS + 1)
        results, threads = _streams(client, started)
        started.wait(timeout=60)
        pair.primary.proc.send_signal(signal.SIGSTOP)
        try:
            for t in threads:
                t.join(timeout=120)
            _each_once(results, references)
        finally:
            pair.primary.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: _stalls(pair.primary_ep, keys) > 0, timeout=60, what="the woken primary's stall")
        refused = _submit_alone(pair.primary_ep, keys)
        active = _active(pair, client)
        if _stalls(pair.backup_ep, keys) == 0:
            assert isinstance(refused, errors.NotActiveError), refused
            assert active == f"active broker: {pair.backup_ep} (backup)"
        assert client.complete("after", max_tokens=5).usage.completion_tokens == 5
    log = (tmp_path / "primary.log").read_text()
    assert "did not run for" in log and "is now passive" in log


class Forger:
    """Binds ``endpoint`` before the broker starts and publishes an active peer's state there every
    50 ms, as a backup that took over would, without any key; ``dialled``: connections it accepted."""

    def __init__(self, endpoint: str):
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.linger = 0
        self._monitor = self._pub.get_monitor_socket(zmq.EVENT_ACCEPTED)
        self._pub.bind(endpoint)
        self.dialled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)  # the one user of the sockets from here

    def __enter__(self) -> Forger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._pub.disable_monitor()
        self._monitor.close(linger=0)
        self._pub.close(linger=0)
        self._context.term()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            send_frames(self._pub, encode(PeerState(int(State.ACTIVE), FORGED)))
            while self._monitor.poll(0):
                recv_monitor_message(self._monitor)
                self.dialled += 1


@contextlib.contextmanager
def _forged_primary(tmp_path: Path, keys: ChildKeys) -> Iterator[tuple[Forger, Client]]:
    """A primary whose peer's state endpoint a forger holds, a null worker and a Client of it."""
    primary, forged_at = free_endpoint(), free_endpoint()
    with fast_heartbeats(0.2), Forger(forged_at) as forger, \
            broker(primary, "--role", "primary", "--peer", forged_at, "--peer-bind", free_endpoint(),
                   env=keys.env("broker"), log=tmp_path / "primary.log"), \
            null_worker(primary, env=keys.env("worker"), log=tmp_path / "worker.log"), \
            Client(primary, settings=keys.client) as client:
        yield forger, client


def _standby(client: Client) -> dict:
    """The broker's STATUS ``standby``, once it answers: its process may take more than the
    client's connect timeout (2 s) to start on a loaded host."""

    def answered() -> dict | None:
        try:
            return client.status(timeout=30)["standby"]
        except errors.BrokerUnavailableError:
            return None

    return wait_for(answered, timeout=60, what="the broker to answer")


def test_an_open_primary_yields_to_a_forger_on_its_peers_state_endpoint(tmp_path):
    """Without CURVE the state link believes whoever holds the peer's endpoint (docs/operations.md):
    the attack the next test shows a closed pair refusing."""
    with _forged_primary(tmp_path, ChildKeys()) as (_, client):
        wait_for(lambda: _standby(client)["peer_endpoint"] == FORGED, timeout=60, what="the forged state")
        assert _standby(client)["state"] == "passive"


def test_a_primary_under_curve_never_hears_a_forger_and_serves(tmp_path):
    """The forger, without the pool's keys, fails every handshake, the primary's redial after an
    expiry of silence too: no state of its reaches the primary, which takes the client's vote and
    serves."""
    with _pool_keys(tmp_path) as keys, _forged_primary(tmp_path, keys) as (forger, client):
        log = tmp_path / "primary.log"
        wait_for(lambda: "reconnecting" in log.read_text(), timeout=60, what="an expiry without a state")
        dialled = forger.dialled
        wait_for(lambda: forger.dialled > dialled, timeout=60, what="the primary to dial the forger again")
        client.submit("a vote", max_tokens=1)  # the primary takes clients now; its worker registers
        wait_for(lambda: len(client.status(timeout=30)["workers"]) == 1, timeout=60, what="the worker")
        assert client.complete("after the forgery", max_tokens=5, timeout=60).usage.completion_tokens == 5
        standby = _standby(client)
        assert (standby["state"], standby["peer_state"], standby["peer_endpoint"]) == ("active", None, "")


def test_a_standby_broker_needs_its_role_peer_and_peer_bind():
    got = subprocess.run([sys.executable, "-m", "ovpool", "broker", "--role", "primary"],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 2
    assert "a standby broker needs all of --role, --peer and --peer-bind" in got.stderr


def test_a_pair_where_neither_answers_is_one_error_naming_both():
    a, b = free_endpoint(), free_endpoint()
    got = subprocess.run([sys.executable, "-m", "ovpool", "status", "--broker", f"{a},{b}"],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode != 0
    assert f"no broker of the pair is active ({a} unreachable, {b} unreachable); " in got.stderr
