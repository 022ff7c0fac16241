"""Every message between client, broker and worker, defined once.

A message travels as three frames: ``[VERSION][command byte][msgpack map]`` (the broker's ROUTER
socket adds the peer's identity frame in front). Each command is a frozen dataclass below; the
map's keys are its field names. ``encode`` and ``decode`` are the only places that touch bytes.

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

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack
import zmq

from ovpool.completion import Completion, Delta, TokenLogprobs
from ovpool.errors import MalformedMessageError, UnsupportedVersionError
from ovpool.prefix_key import KEY_BYTES
from ovpool.sampling_params import SamplingParams
from ovpool.tools import ToolCallDelta

VERSION = b"OVP1"
_MISSING = object()

# The largest message the broker takes (its body frame): a client refuses a bigger SUBMIT before
# sending it; the broker answers one up to twice this size with an error, and libzmq drops the
# connection of a peer that sends more than that (nothing can be answered without reading it).
MAX_MESSAGE_BYTES = 64 << 20
# Route keys a worker reports in a HEARTBEAT (16 bytes each: 4 KiB a heartbeat at most); the
# broker takes this many and ignores the rest. 16 chats of 4 turns hold 16 x 9 message keys.
HELD_KEYS_MAX = 256
# PARTIAL/FINAL/ERROR messages a worker may send before the broker has handled them: the bound of
# the worker's send queue and of the broker's receive queue from it (a few ms of a fast worker).
WORKER_WINDOW = 4096


@dataclass(frozen=True)
class Submit:
    """A client asks for a generation. ``model`` "" means the only model served;
    ``timeout_s`` 0 means no deadline."""

    command: ClassVar[int] = 0x01
    request_id: str
    model: str
    params: dict
    prompt: str | None = None
    messages: list | None = None
    timeout_s: float = 0.0
    window: int = 0  # 0: only the FINAL (no PARTIALs); else a stream with this many tokens of credit
    keep_alive_s: float | None = None  # the model's keep-alive from now on (ovpool.keep_alive); None: its own


@dataclass(frozen=True)
class Cancel:
    command: ClassVar[int] = 0x02
    request_id: str


@dataclass(frozen=True)
class Credit:
    """Client → broker: the reader of stream ``request_id`` took ``tokens`` more PARTIALs.
    Broker → worker (``request_id`` ""): it handled ``tokens`` more of the worker's messages."""

    command: ClassVar[int] = 0x07
    request_id: str
    tokens: int


@dataclass(frozen=True)
class Status:
    command: ClassVar[int] = 0x03


@dataclass(frozen=True)
class Ping:
    """Client liveness; lists the requests the client still waits for."""

    command: ClassVar[int] = 0x04
    request_ids: list = field(default_factory=list)


@dataclass(frozen=True)
class Pong:
    """Which of the pinged requests the broker does not know (lost in a restart: resend them)."""

    command: ClassVar[int] = 0x05
    unknown: list = field(default_factory=list)


@dataclass(frozen=True)
class Supervised:
    """``ovpool serve`` → broker, every half heartbeat interval, no reply: its supervisor's view of
    the workers on ``host``, including those that never registered (failing at start, backing
    off). Each entry is a map with at least ``name``, ``device``, ``state`` (starting, ready,
    backoff, failing, stopped) and ``reason``; STATUS lists them as ``supervised``."""

    command: ClassVar[int] = 0x06
    host: str
    pid: int
    workers: list


@dataclass(frozen=True)
class Drain:
    """Start a drain (``ovpool serve`` on SIGTERM, ``ovpool drain``, the HTTP API's admin route);
    answered with STATUS_REPLY, whose ``draining`` says what drains. ``worker`` "": the whole pool:
    every new SUBMIT is refused (request.draining, retryable) while what was accepted runs on; what
    is still unfinished ``timeout_s`` later fails with request.draining. Else the workers whose id is
    ``worker``, or starts with ``worker@`` (a name, or name@host): they get no new request, what
    they run finishes, and their supervisor stops them once idle. Draining again only shortens the
    pool's deadline, never extends it. Both fields are required: a body that names neither (a
    malformed or fuzzed frame) is refused, never taken for a drain of the pool."""

    command: ClassVar[int] = 0x08
    worker: str
    timeout_s: float


@dataclass(frozen=True)
class ModelOrder:
    """Load or unload a model `ovpool serve` loads on demand (``action`` "load" or "unload"; the
    HTTP API's POST /v1/models/{id}/load|unload); answered with STATUS_REPLY. The broker keeps it
    in STATUS's ``model_orders`` for serve, which carries it out (broker/residency.py)."""

    command: ClassVar[int] = 0x09
    model: str
    action: str


@dataclass(frozen=True)
class Partial:
    """One streamed Delta. ``index`` is its position in the completion (a token without text sends
    no PARTIAL, so indices may skip); ``seq`` numbers the request's PARTIALs 0, 1, 2, ... (the key
    for de-duplication and for gap detection: a jump in ``seq`` means a lost message);
    ``logprobs`` its TokenLogprobs in their wire form (empty unless the request asked);
    ``tool_calls`` its ToolCallDeltas as [index, id, name, arguments] lists (ovpool.tools)."""

    command: ClassVar[int] = 0x10
    request_id: str
    index: int
    token_id: int
    text: str
    seq: int
    logprobs: list = field(default_factory=list)
    tool_calls: list = field(default_factory=list)


@dataclass(frozen=True)
class Final:
    """A finished generation; ``completion`` is ``Completion.to_dict()``; ``partials``: how many
    PARTIALs the worker sent before it (a stream that got fewer lost its tail)."""

    command: ClassVar[int] = 0x11
    request_id: str
    completion: dict
    partials: int = 0


@dataclass(frozen=True)
class Error:
    """A failed request (``request_id`` "" when the failure is not tied to one)."""

    command: ClassVar[int] = 0x12
    request_id: str
    code: str
    message: str


@dataclass(frozen=True)
class StatusReply:
    command: ClassVar[int] = 0x13
    status: dict


@dataclass(frozen=True)
class Shutdown:
    """Broker → every client it heard from lately, as it stops (SIGTERM/SIGINT): what they wait
    for will not come, so they fail it now instead of waiting out their timeouts."""

    command: ClassVar[int] = 0x14
    reason: str = ""


@dataclass(frozen=True)
class Ready:
    """A worker registers: what it serves, how many sessions at once, and how it loaded its model
    (``load``: see ``load_to_wire``; {} without a model)."""

    command: ClassVar[int] = 0x20
    worker_id: str
    models: list
    device: str
    slots: int
    host: str
    pid: int
    load: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Heartbeat:
    """Liveness, both ways. From a worker it also carries its prefix-cache summary: ``held``, the
    route keys (ovpool.prefix_key) of prompts whose KV it still caches, most recently used first,
    at most ``HELD_KEYS_MAX``; and its counters since it started, ``prompt_tokens`` (every prompt
    token it was asked for) and ``cached_prompt_tokens`` (those it took from its cache)."""

    command: ClassVar[int] = 0x21
    held: list = field(default_factory=list)
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0


@dataclass(frozen=True)
class Disconnect:
    """Worker → broker: leaving, these requests are unfinished. Broker → worker: register again."""

    command: ClassVar[int] = 0x22
    request_ids: list = field(default_factory=list)


@dataclass(frozen=True)
class LoadFailed:
    """A worker could not load its model and will not register (no reply): ``models`` are the names
    it was to serve, ``code``/``message`` its error (errors.py). The broker names it in STATUS
    (``failed``) and in the error of a request for those models."""

    command: ClassVar[int] = 0x24
    worker_id: str
    models: list
    device: str
    host: str
    pid: int
    code: str
    message: str


@dataclass(frozen=True)
class PeerState:
    """A broker of a standby pair → its peer, every heartbeat interval: its Binary Star state
    (ovpool.broker.binary_star.State: 1 primary, 2 backup, 3 active, 4 passive) and the endpoint
    its clients and workers connect to (for ``ovpool status``). A passive broker answers a client's
    SUBMIT, PING or DRAIN, and a worker's READY, with ERROR request.broker_unavailable.not_active."""

    command: ClassVar[int] = 0x30
    state: int
    endpoint: str = ""


@dataclass(frozen=True)
class Request:
    """The broker hands a request to a worker; ``params`` are validated SamplingParams;
    ``route_keys``: the prompt's route keys (ovpool.prefix_key), for the worker's cache report."""

    command: ClassVar[int] = 0x23
    request_id: str
    model: str
    params: dict
    prompt: str | None = None
    messages: list | None = None
    route_keys: list = field(default_factory=list)


Message = (Submit | Cancel | Credit | Status | Ping | Pong | Supervised | Partial | Final | Error
           | StatusReply | Shutdown | Ready | Heartbeat | Disconnect | LoadFailed | Request | Drain
           | ModelOrder | PeerState)

_BY_COMMAND: dict[int, type] = {cls.command: cls for cls in Message.__args__}
_COMMAND_BYTES: dict[type, bytes] = {cls: bytes([cls.command]) for cls in _BY_COMMAND.values()}
# Field name -> accepted Python types, per class (annotations are strings under __future__).
_TYPES = {"str": (str,), "int": (int,), "float": (float, int), "dict": (dict,), "list": (list,),
          "str | None": (str, type(None)), "list | None": (list, type(None)),
          "float | None": (float, int, type(None))}
_SCHEMA: dict[type, dict[str, tuple[tuple[type, ...], bool]]] = {
    cls: {f.name: (_TYPES[f.type], f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING)
          for f in dataclasses.fields(cls)}
    for cls in _BY_COMMAND.values()
}


_packb = msgpack.Packer(use_bin_type=True).pack
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


def encode(msg: Message) -> list[bytes]:
    # A dataclass instance's __dict__ holds exactly its fields (ClassVars live on the class).
    return [VERSION, _COMMAND_BYTES[type(msg)], _packb(msg.__dict__)]


def message_type(frames: list[bytes]) -> type:
    """The class of the message in ``frames`` without unpacking its body, for a receiver that
    only counts some messages (benchmarks/broker_driver.py); raises a ProtocolError."""
    if len(frames) != 3:
        raise MalformedMessageError(f"expected 3 frames (version, command, body), got {len(frames)}")
    version, command, _ = frames
    if version != VERSION:
        raise UnsupportedVersionError(f"protocol version {bytes(version)[:16]!r} is not {VERSION!r}")
    cls = _BY_COMMAND.get(command[0]) if len(command) == 1 else None
    if cls is None:
        raise MalformedMessageError(f"unknown command {bytes(command)[:8]!r}")
    return cls


def decode(frames: list[bytes]) -> Message:
    """The message in ``frames`` (identity frames already removed); raises a ProtocolError."""
    cls = message_type(frames)
    try:
        data = msgpack.unpackb(frames[2], raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types for corrupt input
        raise MalformedMessageError(f"{cls.__name__}: body is not valid msgpack") from exc
    return cls(**_checked(cls, data))


def request_id_of(frames: list[bytes]) -> str:
    """The request a message of a known command names though ``decode`` refused it ("" if none),
    so that its receiver can fail that request alone instead of leaving it waiting."""
    try:
        message_type(frames)
        data = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
    except Exception:  # a ProtocolError, or msgpack's several types for corrupt input
        return ""
    rid = data.get("request_id") if type(data) is dict else None
    return rid if type(rid) is str else ""


def _checked(cls: type, data: Any) -> dict[str, Any]:
    if type(data) is not dict:
        raise MalformedMessageError(f"{cls.__name__}: body must be a map")
    out = {}
    for name, (types, required) in _SCHEMA[cls].items():
        value = data.get(name, _MISSING)
        if value is _MISSING:
            if required:
                raise MalformedMessageError(f"{cls.__name__}: missing field {name!r}")
        elif type(value) in types:  # exact types: a bool is not an int here
            out[name] = value
        else:
            raise MalformedMessageError(f"{cls.__name__}.{name}: unexpected type {type(value).__name__}")
    return out


def route_keys_from_wire(keys: list, limit: int = HELD_KEYS_MAX) -> tuple[bytes, ...]:
    """REQUEST's ``route_keys`` or HEARTBEAT's ``held``: the first ``limit`` keys; raises
    MalformedMessageError unless each is a bytes string of prefix_key.KEY_BYTES."""
    keys = keys[:limit]
    if not all(type(k) is bytes and len(k) == KEY_BYTES for k in keys):
        raise MalformedMessageError(f"route keys must be {KEY_BYTES}-byte strings")
    return tuple(keys)


def partial_of(request_id: str, delta: Delta, seq: int) -> Partial:
    """A worker's PARTIAL for ``delta``."""
    return Partial(request_id, delta.index, delta.token_id, delta.text, seq,
                   [t.to_wire() for t in delta.logprobs], [c.to_wire() for c in delta.tool_calls])


def delta_of(msg: Partial) -> Delta:
    """The Delta of a PARTIAL from an untrusted peer; raises MalformedMessageError."""
    return Delta(msg.index, msg.token_id, msg.text,
                 TokenLogprobs.list_from_wire(msg.logprobs, "PARTIAL.logprobs"),
                 ToolCallDelta.list_from_wire(msg.tool_calls, "PARTIAL.tool_calls"))


def completion_to_wire(c: Completion) -> dict[str, Any]:
    """A FINAL's ``completion`` map."""
    return c.to_dict()


def load_to_wire(report: dict | None) -> dict[str, Any]:
    """``Engine.load_report`` as READY's ``load``: {outcome (hit, wrote, compiled...), seconds (all
    load phases together), entry (the cache entry or None), batching (whether the worker batches
    and how it gets that graph, in words; None if it does not say), chat (whether the model has a
    chat template: false for a completion-only base model; None if the worker does not say, which
    the HTTP API takes as chat), graph (the graph settings as the worker resolved them, every
    ``auto`` replaced: ``ovpool status`` shows them; None if it does not say), kv_tier (true, or
    absent: whether it reads and writes its host's KV tier, broker/host_tiers.py)}; {} for a
    backend without a model."""
    if not report:
        return {}
    phases = report.get("seconds") or {}
    seconds = sum(phases.values()) if isinstance(phases, dict) else float(phases)
    return {"outcome": report["outcome"], "seconds": round(seconds, 3), "entry": report.get("entry"),
            "batching": report.get("batching"), "chat": report.get("chat"),
            "graph": report.get("graph_settings"), **({"kv_tier": True} if report.get("kv_tier") else {})}


def sampling_to_wire(params: SamplingParams) -> dict[str, Any]:
    """SamplingParams as a SUBMIT/REQUEST ``params`` map."""
    return params.to_dict()


def sampling_from_wire(params: dict) -> SamplingParams:
    """Validated sampling parameters from a SUBMIT/REQUEST; bad values raise InvalidRequestError."""
    return SamplingParams.from_dict(params)
