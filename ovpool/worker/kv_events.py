"""Prefix-cache block events on a ZeroMQ PUB socket, in vLLM's KV-events wire shape, for a
gateway's prefix index (llm-d's precise prefix scorer; docs/operations.md, "Beyond one host").

Each message is three frames, as vLLM's ZmqEventPublisher sends them: the topic
(``kv@<pod>@<model>``, the one llm-d's subscriber parses), the batch's sequence number (8 bytes,
big-endian, from 0) and the msgpack payload: a ``KVEventBatch`` as msgspec encodes vLLM's
``array_like`` structs, ``[ts, [event, ...], data_parallel_rank]``, each event a tagged array:

- ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]``
- ``["BlockRemoved", block_hashes, medium]``
- ``["AllBlocksCleared"]``

A block hash is ovpool's own chain hash (ovpool.worker.generate.blocks.chain_hash), its first 8
bytes as an unsigned 64-bit integer (msgpack's widest): a scorer must hash prompts ovpool's way,
exactly as it must hash them vLLM's way for vLLM. The worker's pool starts empty, so the first
batch says ``AllBlocksCleared``: an index that knew this pod before (a restart) forgets it.
"""

from __future__ import annotations

import socket as _socket
from collections.abc import Sequence

import msgpack
import zmq

from ovpool.errors import InvalidSettingError
from ovpool.worker.generate.blocks import Removed, Stored

MEDIUM = "CPU"  # where the blocks live, as vLLM's medium names it ("GPU" for its own)


def block_hash(address: bytes) -> int:
    return int.from_bytes(address[:8], "big")


def topic(model: str, pod: str | None = None) -> str:
    """``kv@<pod>@<model>``; the pod defaults to the host name (a Kubernetes pod's name)."""
    return f"kv@{pod or _socket.gethostname()}@{model}"


def event_to_wire(event: Stored | Removed, block_size: int) -> list:
    if isinstance(event, Stored):
        parent = None if event.parent is None else block_hash(event.parent)
        return ["BlockStored", [block_hash(event.address)], parent, list(event.tokens), block_size,
                None, MEDIUM]
    return ["BlockRemoved", [block_hash(event.address)], MEDIUM]


def encode_batch(events: Sequence[Stored | Removed], block_size: int, ts: float, *,
                 cleared: bool = False, rank: int = 0) -> bytes:
    """A KVEventBatch's msgpack bytes; ``cleared``: an AllBlocksCleared first."""
    wire = [["AllBlocksCleared"]] if cleared else []
    wire += [event_to_wire(e, block_size) for e in events]
    return msgpack.packb([ts, wire, rank])


class KvEventPublisher:
    """``with KvEventPublisher(endpoint, topic) as p: p.publish(block_size, events, ts)``.
    ``endpoint`` is bound where it has a wildcard (``tcp://*:5557``), else connected to, as vLLM
    does. It is an XPUB, a PUB that also hears subscriptions (``wait_subscriber``); it drops what
    no subscriber takes, so a gateway that is down slows nothing."""

    def __init__(self, endpoint: str, topic: str):
        self.endpoint, self._topic = endpoint, topic.encode()
        self._context: zmq.Context | None = None
        self._socket: zmq.Socket | None = None
        self._seq = 0

    def __enter__(self) -> KvEventPublisher:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.XPUB)
        try:
            if "*" in self.endpoint or self.endpoint.startswith(("ipc://", "inproc://")):
                self._socket.bind(self.endpoint)
            else:
                self._socket.connect(self.endpoint)
        except zmq.ZMQError as err:
            self.__exit__()
            # Two workers of one pool cannot bind one port: they connect to the indexer instead.
            raise InvalidSettingError(
                f"kv_events_endpoint {self.endpoint!r}: {err}; give each worker its own port, or "
                "tcp://<indexer>:<port> to connect to a central subscriber") from None
        return self

    def __exit__(self, *exc: object) -> None:
        self._socket.close(linger=0)
        self._context.term()

    def wait_subscriber(self, timeout_s: float) -> bool:
        """Wait for a subscription (what is published after it reaches that subscriber)."""
        if not self._socket.poll(int(timeout_s * 1000)):
            return False
        self._heard()
        return True

    def _heard(self) -> None:
        """Read the subscriptions heard so far: unread, they would pile up."""
        while self._socket.poll(0):
            self._socket.recv()

    def publish(self, block_size: int, events: Sequence[Stored | Removed], ts: float) -> None:
        """Send one batch (nothing when there is nothing to say, but the first, which clears)."""
        self._heard()
        first = self._seq == 0
        if not events and not first:
            return
        payload = encode_batch(events, block_size, ts, cleared=first)
        self._socket.send_multipart([self._topic, self._seq.to_bytes(8, "big"), payload])
        self._seq += 1
