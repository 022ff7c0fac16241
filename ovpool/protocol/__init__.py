"""Every message between client, broker and worker, defined once.

A message travels as three frames: ``[VERSION][command byte][msgpack map]`` (the broker's ROUTER
socket adds the peer's identity frame in front). Each command is a frozen dataclass (messages.py); the
map's keys are its field names. ``encode`` and ``decode`` are the only places that touch bytes.

The package: ``messages`` (every message, defined once, and the limits on them), ``codec``
(messages to frames and back, checked), ``frames`` (frames to and from a zmq socket) and
``wire`` (the wire forms of the records messages carry). Import them all from here.

Who sends what::

    client → broker   SUBMIT, CANCEL, CREDIT, STATUS, PING, SUPERVISED (from ``ovpool serve``), DRAIN,
                      MODEL_ORDER
    broker → client   PARTIAL, FINAL, ERROR, STATUS_REPLY, PONG, SHUTDOWN
    worker → broker   READY, HEARTBEAT, PARTIAL, FINAL, ERROR, DISCONNECT, LOAD_FAILED
    broker → worker   REQUEST, CANCEL, CREDIT, HEARTBEAT, DISCONNECT
    broker → broker   PEER_STATE (the standby pair's own PUB/SUB sockets, ovpool.broker.binary_star)

Flow control (docs/protocol.md): every sender of PARTIALs holds credit granted by its receiver, so
no queue grows past what the receiver agreed to take and no layer ever drops a message. A worker
starts each connection with ``WORKER_WINDOW`` messages of credit and the broker returns credit as
it handles them; a streaming client grants each stream ``Submit.window`` tokens and returns
credit as its reader consumes them.

A decode failure raises ``UnsupportedVersionError`` or ``MalformedMessageError``; the receiver
answers a client with ERROR or logs and drops the frames, and keeps serving.
"""

from ovpool.protocol.codec import VERSION, decode, encode, message_type, request_id_of
from ovpool.protocol.frames import recv_frames, send_frames
from ovpool.protocol.messages import (
    HELD_KEYS_MAX,
    MAX_MESSAGE_BYTES,
    WORKER_WINDOW,
    Cancel,
    Credit,
    Disconnect,
    Drain,
    Error,
    Final,
    Heartbeat,
    LoadFailed,
    Message,
    ModelOrder,
    Partial,
    PeerState,
    Ping,
    Pong,
    Ready,
    Request,
    Shutdown,
    Status,
    StatusReply,
    Submit,
    Supervised,
)
from ovpool.protocol.wire import (
    completion_to_wire,
    delta_of,
    load_to_wire,
    partial_of,
    route_keys_from_wire,
    sampling_from_wire,
    sampling_to_wire,
)

__all__ = [
    "HELD_KEYS_MAX", "MAX_MESSAGE_BYTES", "VERSION", "WORKER_WINDOW",
    "Cancel", "Credit", "Disconnect", "Drain", "Error", "Final", "Heartbeat", "LoadFailed", "Message",
    "ModelOrder", "Partial", "PeerState", "Ping", "Pong", "Ready", "Request", "Shutdown", "Status",
    "StatusReply", "Submit", "Supervised",
    "completion_to_wire", "decode", "delta_of", "encode", "load_to_wire", "message_type", "partial_of",
    "recv_frames", "request_id_of", "route_keys_from_wire", "sampling_from_wire", "sampling_to_wire",
    "send_frames",
]
