"""A standby broker's peer-state socket against a hostile publisher on the peer's endpoint."""

from __future__ import annotations

import time

import zmq

from ovpool.broker.binary_star import State
from ovpool.broker.standby import Standby, StandbyLink
from ovpool.protocol import PeerState, encode, send_frames


def test_a_flood_of_junk_neither_holds_the_loop_nor_hides_the_peer(tmp_path):
    peer = f"ipc://{tmp_path}/peer"
    context = zmq.Context()
    hostile = context.socket(zmq.PUB)
    hostile.bind(peer)
    standby = Standby("backup", f"ipc://{tmp_path}/own", peer)
    try:
        with StandbyLink(context, standby, "tcp://127.0.0.1:1", time.monotonic()) as link:
            time.sleep(0.5)  # the SUB's connection and subscription reach the PUB
            for _ in range(10_000):
                hostile.send_multipart([b"", b"\xff\x00junk"])
            turns = 0
            deadline = time.monotonic() + 30
            while link.peer_state is None and time.monotonic() < deadline:
                send_frames(hostile, encode(PeerState(int(State.ACTIVE), "tcp://peer:5555")))
                link.turn(time.monotonic())
                turns += 1
            assert link.peer_state is State.ACTIVE and link.peer_served == "tcp://peer:5555"
            assert turns > 1  # the flood took more than one bounded turn to read
    finally:
        hostile.close(linger=0)
        context.term()
