"""A message's frames to and from a zmq socket, without pyzmq's per-frame Python overhead."""

from __future__ import annotations

import zmq

# Plain ints: pyzmq's send_multipart/recv_multipart spend most of their time on IntFlag arithmetic.
_SNDMORE = int(zmq.SNDMORE)
# The compiled send, without zmq.Socket.send's Python wrapper (routing_id/group for draft sockets,
# unused here): a third of the cost per frame.
_send = zmq.backend.Socket.send


def send_frames(socket: zmq.Socket, frames: list[bytes], flags: int = 0) -> None:
    """``socket.send_multipart(frames, flags)``, several times cheaper per message."""
    flags = int(flags)  # zmq.NOBLOCK is an IntFlag: ``|`` on it runs enum code for every frame
    for frame in frames[:-1]:
        _send(socket, frame, _SNDMORE | flags)
    _send(socket, frames[-1], flags)


def recv_frames(socket: zmq.Socket, flags: int = int(zmq.NOBLOCK)) -> list[bytes]:
    """``socket.recv_multipart(flags)`` without the enum overhead; raises zmq.Again when empty.
    A Frame's ``more`` replaces ``socket.get(RCVMORE)``, which converts the option to an enum."""
    recv = socket.recv
    frame = recv(flags, copy=False)
    frames = [frame.bytes]
    while frame.more:
        frame = recv(flags, copy=False)
        frames.append(frame.bytes)
    return frames
