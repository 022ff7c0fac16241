"""A standby broker's peer-state link against hostile processes on its endpoints: a flood of junk,
an oversized frame, and, under the pool's CURVE keys, a forger without them."""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Iterator

import zmq

from ovpool.auth import ServerSecurity
from ovpool.broker.binary_star import State
from ovpool.broker.standby import Standby, StandbyLink
from ovpool.config import BrokerConfig
from ovpool.pool_keys import PoolKeys
from ovpool.protocol import PeerState, encode, send_frames
from ovpool.testing.pool import fast_heartbeats

FORGED = "tcp://forged:1"


@contextlib.contextmanager
def _link(context: zmq.Context, config: BrokerConfig, role: str, bind: str,
          peer: str) -> Iterator[StandbyLink]:
    """A link whose clients' endpoint is ``tcp://ROLE:5555``, with the broker's security for it."""
    with ServerSecurity(context, config) as security, \
            StandbyLink(context, security, Standby(role, bind, peer), f"tcp://{role}:5555",
                        time.monotonic()) as link:
        yield link


def _until(condition, turns, timeout: float = 30.0) -> int:
    """Run ``turns()`` until ``condition()``; how many turns it took (AssertionError at the deadline)."""
    deadline, count = time.monotonic() + timeout, 0
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        turns()
        count += 1
    return count


def _publish(sock: zmq.Socket, state: State, endpoint: str) -> None:
    send_frames(sock, encode(PeerState(int(state), endpoint)))


def test_a_flood_of_junk_neither_holds_the_loop_nor_hides_the_peer(tmp_path):
    peer = f"ipc://{tmp_path}/peer"
    context = zmq.Context()
    hostile = context.socket(zmq.XPUB)  # a PUB that hands us its subscribers' subscriptions
    hostile.bind(peer)
    try:
        with _link(context, BrokerConfig(), "backup", f"ipc://{tmp_path}/own", peer) as link:
            assert hostile.poll(30_000) and hostile.recv() == b"\x01"  # subscribed: the flood reaches it
            for _ in range(10_000):
                hostile.send_multipart([b"", b"\xff\x00junk"])

            def turn() -> None:
                _publish(hostile, State.ACTIVE, "tcp://peer:5555")
                link.turn(time.monotonic())

            turns = _until(lambda: link.peer_state is not None, turn)
            assert link.peer_state is State.ACTIVE and link.peer_served == "tcp://peer:5555"
            assert turns > 1  # the flood took more than one bounded turn to read
    finally:
        hostile.close(linger=0)
        context.term()


def test_an_oversized_frame_costs_the_link_its_connection_never_its_hearing(tmp_path):
    """libzmq drops a connection that brings a frame past the bound and never dials it again; the
    link, silent for an expiry, does."""
    peer = f"ipc://{tmp_path}/peer"
    context = zmq.Context()
    publisher = context.socket(zmq.PUB)
    publisher.bind(peer)
    try:
        with fast_heartbeats(0.2), \
                _link(context, BrokerConfig(), "backup", f"ipc://{tmp_path}/own", peer) as link:

            def turn(state: State) -> None:
                _publish(publisher, state, "tcp://peer:5555")
                link.turn(time.monotonic())
                time.sleep(0.01)

            _until(lambda: link.peer_state is State.PASSIVE, lambda: turn(State.PASSIVE))
            publisher.send(b"\0" * (1 << 20))  # its connection ends here: what follows needs a new one
            _until(lambda: link.peer_state is State.ACTIVE, lambda: turn(State.ACTIVE))
    finally:
        publisher.close(linger=0)
        context.term()


def test_under_curve_only_the_pairs_key_reaches_the_fsm_or_reads_its_states(tmp_path):
    """A forger on the peer's endpoint first, plain and with a key of its own, publishes ACTIVE:
    none of it reaches the backup's state machine. Once it leaves, the primary holding the pair's
    key binds there and is heard; a reader with another key hears nothing from the backup."""
    peer, own = f"ipc://{tmp_path}/peer", f"ipc://{tmp_path}/own"
    context = zmq.Context()
    with PoolKeys(tmp_path) as keys:
        config = BrokerConfig.from_values(keys.broker_settings())
        with fast_heartbeats(0.2), _link(context, config, "backup", own, peer) as backup:
            spy = context.socket(zmq.SUB)
            spy.curve_publickey, spy.curve_secretkey = zmq.curve_keypair()
            spy.curve_serverkey = zmq.auth.load_certificate(keys.client_settings()["curve_server_key"])[0]
            spy.setsockopt(zmq.SUBSCRIBE, b"")
            spy.connect(own)
            for forger in _forgers(context):
                forger.bind(peer)
                deadline = time.monotonic() + 4 * backup.star.expiry_s  # through redials
                while time.monotonic() < deadline:
                    _publish(forger, State.ACTIVE, FORGED)
                    backup.turn(time.monotonic())
                    time.sleep(0.01)
                    assert backup.peer_state is None
                forger.close(linger=0)
            other = zmq.Context()  # a ZAP handler per context: the primary is another process's
            with _link(other, config, "primary", peer, own) as primary:

                def turn() -> None:
                    now = time.monotonic()
                    backup.turn(now), primary.turn(now)
                    time.sleep(0.01)

                _until(lambda: backup.peer_state is not None and primary.peer_state is not None, turn)
                assert backup.peer_served == "tcp://primary:5555"
                assert primary.peer_served == "tcp://backup:5555"
            other.term()
            assert spy.poll(0) == 0
            spy.close(linger=0)
    context.term()


def _forgers(context: zmq.Context) -> list[zmq.Socket]:
    """A plain publisher, and a CURVE publisher with a key pair of its own."""
    plain, keyed = context.socket(zmq.PUB), context.socket(zmq.PUB)
    keyed.curve_publickey, keyed.curve_secretkey = zmq.curve_keypair()
    keyed.curve_server = True
    for sock in (plain, keyed):
        sock.linger = 0
    return [plain, keyed]


def test_a_broker_stopped_mid_drain_goes_passive_before_it_routes_what_waited(monkeypatch):
    """SIGSTOP can land while the broker reads its socket, whose messages then carry the drain's
    time from before the freeze: each is routed only after a look at the clock, so the woken
    broker refuses them as the passive one it now is (its peer may have taken over)."""
    from ovpool.broker import roles, server
    from ovpool.errors import NotActiveError
    from ovpool.protocol import Error, decode
    from ovpool.submit import make_submit

    broker = server.Broker("tcp://127.0.0.1:5555", standby=Standby("primary", "tcp://127.0.0.1:5556",
                                                                   "tcp://127.0.0.1:5557"))
    star = broker._standby.star
    drain_began = time.monotonic()
    star.peer(State.BACKUP, drain_began)
    assert star.active
    woke = drain_began + 10 * star.expiry_s  # the process was stopped, then continued
    monkeypatch.setattr(server, "time", types.SimpleNamespace(monotonic=lambda: woke))
    submit = make_submit("waited through the freeze", "", None, {"max_tokens": 1})
    broker._route([b"client", *encode(submit)], roles.ANY, drain_began)
    (peer, *frames), = broker._outbox
    answer = decode(frames)
    assert peer == b"client" and type(answer) is Error and answer.code == NotActiveError.code
    assert (star.state, star.stalls) == (State.PASSIVE, 1) and not broker.router.jobs
    broker._context.term()
