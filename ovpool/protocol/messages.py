"""Every wire message, defined once: a frozen dataclass per command, its fields the keys of its
msgpack map (ovpool/protocol/__init__.py: who sends what), and the limits on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

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
