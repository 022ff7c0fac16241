"""What the broker remembers about each worker and request (plain records; Router owns the logic)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ovpool import timing
from ovpool.broker.prefixes import HeldPrefixes
from ovpool.prefix_key import NO_KEYS, RouteKeys
from ovpool.protocol import LoadFailed, Message, Ready, Request, Supervised

Output = list[tuple[bytes, Message]]  # what the routing core asks the server to send, in order

_MAX_HOSTS = 1000  # supervisor reports (and load failures) kept at once; the stalest goes first
# A LOAD_FAILED is kept this long, or as long as its host's ``ovpool serve`` reports that worker
# failing: long enough to answer the requests of a restarted broker's grace with its reason, and
# a forged one stops failing requests soon after its sender stops.
LOAD_FAILED_EXPIRY_S = timing.BROKER_GRACE_S


@dataclass
class RegisteredWorker:
    """``cap``: the slots the broker fills, at most the advertised ``info.slots`` (which the broker
    cuts to bounds.MAX_SLOTS). A request that makes no progress there lowers it to what the worker still
    runs; each FINAL raises it by one, so a worker that stalls (or lies about its slots) stops
    attracting requests."""

    identity: bytes
    info: Ready
    expires: float
    inflight: set[str] = field(default_factory=set)
    cap: int = 0
    unacked: int = 0  # replies handled since the last CREDIT sent to it
    draining: bool = False  # a DRAIN named it: no new request (broker/drain.py)
    prefixes: HeldPrefixes = field(default_factory=HeldPrefixes)

    def __post_init__(self) -> None:
        self.cap = self.info.slots

    def describe(self, now: float) -> dict:
        i = self.info
        return {"id": i.worker_id, "models": list(i.models), "device": i.device, "slots": i.slots,
                "cap": self.cap, "active": len(self.inflight), "host": i.host, "pid": i.pid,
                "load": dict(i.load), "expires_in_s": round(self.expires - now, 3), "draining": self.draining,
                "prefix_cache": self.prefixes.describe()}


@dataclass
class Job:
    """One accepted request: queued when ``worker`` is None, else in flight there."""

    request: Request
    client: bytes
    deadline: float
    queued_at: float
    waiting_since: float = 0.0
    worker: bytes | None = None
    attempts: int = 0
    next_seq: int = 0  # the seq of the next PARTIAL the client has not seen yet
    progress_at: float | None = None  # its latest PARTIAL (or first tick) on its current worker
    route: RouteKeys = NO_KEYS  # its prompt's route keys (the same as request.route_keys)
    max_tokens: int = 1 << 63  # its sampling max_tokens: no honest worker sends more PARTIALs
    keep_alive_s: float | None = None  # its model's keep-alive from now on (KeepAlives); None: its own

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def model(self) -> str:
        return self.request.model


@dataclass
class Counters:
    submitted: int = 0
    rejected: int = 0
    dispatched: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    timed_out: int = 0
    requeued: int = 0
    stalled: int = 0
    malformed: int = 0
    prefix_hits: int = 0  # dispatches of a request with route keys to a worker holding some of them
    prefix_misses: int = 0  # ... to a worker believed to hold none

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class KeepAlives:
    """Each model's keep-alive as the latest request for it set it (SUBMIT.keep_alive_s): the last
    request wins, as in Ollama, and one without sets its model back to its own (so it is dropped
    here). STATUS's ``keep_alive`` (model -> seconds), which the serve that loads it follows."""

    _MAX = 1024  # models named by requests: beyond this the oldest entry goes (back to its own)

    def __init__(self) -> None:
        self._by_model: dict[str, float] = {}

    def note(self, model: str, keep_alive_s: float | None) -> None:
        self._by_model.pop(model, None)
        if keep_alive_s is not None:
            if len(self._by_model) >= self._MAX:
                del self._by_model[next(iter(self._by_model))]
            self._by_model[model] = keep_alive_s

    def entries(self) -> dict[str, float]:
        return dict(self._by_model)


class ModelOrders:
    """Loads and unloads asked for (protocol.ModelOrder), kept SUPERVISED_EXPIRY_S for the ``ovpool
    serve`` that loads the model on demand to see in STATUS and carry out once (by ``id``)."""

    _MAX = 64

    def __init__(self, epoch: str) -> None:
        self._epoch, self._count = epoch, 0  # ids stay unique across broker restarts
        self._orders: list[tuple[float, dict]] = []

    def add(self, model: str, action: str, now: float) -> None:
        self._count += 1
        self._orders = [*self._orders[-(self._MAX - 1):],
                        (now, {"id": f"{self._epoch}-{self._count}", "model": model, "action": action})]

    def expire(self, now: float) -> None:
        self._orders = [(t, o) for t, o in self._orders if now - t < timing.SUPERVISED_EXPIRY_S]

    def entries(self) -> list[dict]:
        return [dict(o) for _, o in self._orders]


class SupervisedHosts:
    """The latest ``ovpool serve`` report per host, forgotten SUPERVISED_EXPIRY_S after it came."""

    def __init__(self) -> None:
        self._hosts: dict[str, tuple[float, Supervised]] = {}

    def update(self, msg: Supervised, now: float) -> None:
        if msg.host not in self._hosts and len(self._hosts) >= _MAX_HOSTS:
            del self._hosts[min(self._hosts, key=lambda h: self._hosts[h][0])]
        self._hosts[msg.host] = (now + timing.SUPERVISED_EXPIRY_S, msg)

    def expire(self, now: float) -> None:
        for host in [h for h, (expires, _) in self._hosts.items() if now >= expires]:
            del self._hosts[host]

    def entries(self) -> list[dict]:
        """Every supervised worker of every host, as ``{"host": ..., **entry}``."""
        return [{**w, "host": host} for host, (_, msg) in sorted(self._hosts.items()) for w in msg.workers]

    def residency(self, model: str) -> tuple[str, str]:
        """(state, reason) of ``model`` in a supervisor's catalog of models it loads on demand
        (broker/residency.py: unloaded, loading, loaded, unloading, failed), ("", "") if none has it.
        A model some host can serve wins over one failed elsewhere."""
        found = [(w.get("residency"), w.get("residency_reason", "")) for _, msg in self._hosts.values()
                 for w in msg.workers if w.get("model") == model and isinstance(w.get("residency"), str)]
        usable = [f for f in found if f[0] != "failed"]
        return (usable or found or [("", "")])[0]

    def failing(self) -> set[tuple[str, str]]:
        """(host, worker name) of each worker a supervisor reports failing."""
        return {(host, w.get("name")) for host, (_, msg) in self._hosts.items() for w in msg.workers
                if w.get("state") == "failing"}

    def __len__(self) -> int:
        return len(self._hosts)


def _worker_name(worker_id: str) -> str:
    """``name@host:pid`` -> ``name``: one record per named worker of a host, whatever its pid."""
    return worker_id.rsplit("@", 1)[0]


class LoadFailures:
    """The latest LOAD_FAILED per (host, worker name) (bounds.fit_load_failed checked it).
    Forgotten when that worker registers, when a READY serves one of its models, or
    LOAD_FAILED_EXPIRY_S after it came while its host's ``ovpool serve`` does not report that
    worker failing."""

    def __init__(self) -> None:
        self._failed: dict[tuple[str, str], tuple[float, float, LoadFailed]] = {}  # (came, expires, msg)

    def record(self, msg: LoadFailed, now: float) -> None:
        key = (msg.host, _worker_name(msg.worker_id))
        if key not in self._failed and len(self._failed) >= _MAX_HOSTS:
            del self._failed[min(self._failed, key=lambda k: self._failed[k][0])]
        self._failed[key] = (now, now + LOAD_FAILED_EXPIRY_S, msg)

    def registered(self, msg: Ready) -> None:
        served = set(msg.models)
        for key in [k for k, (_, _, m) in self._failed.items()
                    if k == (msg.host, _worker_name(msg.worker_id)) or served.intersection(m.models)]:
            del self._failed[key]

    def expire(self, now: float, supervised: SupervisedHosts) -> None:
        if not self._failed:
            return
        failing = supervised.failing()
        for key, (came, expires, msg) in list(self._failed.items()):
            if key in failing:
                self._failed[key] = (came, now + LOAD_FAILED_EXPIRY_S, msg)
            elif now >= expires:
                del self._failed[key]

    def explain(self, model: str) -> str:
        """"worker X failed: why; ..." for the failures of ``model`` ("" : of any model), else ""."""
        found = [m for _, _, m in self._failed.values() if not model or model in m.models]
        return "; ".join(f"worker {m.worker_id} failed: {m.message}" for m in found)

    def entries(self, now: float) -> list[dict]:
        return [{"id": m.worker_id, "models": list(m.models), "device": m.device, "host": m.host,
                 "pid": m.pid, "code": m.code, "message": m.message, "age_s": round(now - t, 3)}
                for t, _, m in self._failed.values()]

    def __len__(self) -> int:
        return len(self._failed)
