"""The worker process: one DEALER socket to the broker (ovpool.worker.link, whose keeper thread
heartbeats while a step holds the loop), a Backend doing the generation.

The loop polls the socket without waiting while sessions are active (generation is the work;
messages are handled between steps), and up to a poll interval when idle. Every PARTIAL,
FINAL and ERROR spends one message of credit (protocol.WORKER_WINDOW per connection, returned by
the broker's CREDIT as it handles them); without credit the worker stops stepping until CREDIT
comes, so a broker that routes slower than the worker generates slows the worker down instead of
letting its send queue overflow. A broker that is silent for the heartbeat expiry is presumed
gone: the worker drops its sessions (the broker has re-dispatched them), reconnects with a
doubling backoff and registers again. Stopping (SIGTERM in the CLI) hands unfinished
requests back with DISCONNECT before the socket closes. No message from the broker stops the loop:
one that does not decode is dropped, a request that cannot start is answered with an ERROR.

The backend's idle work (a worker's warm-up: compiling the decode graph, setting kernels up, about
2 s on SmolLM2 and far more on a loaded host) runs on a thread of its own while the loop goes on
serving messages: requests that arrive meanwhile wait until it ends, since the backend is not
thread-safe.
"""

from __future__ import annotations

import logging
import os
import socket as _socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import zmq

from ovpool import endpoint, timing
from ovpool.auth import secure_peer
from ovpool.config import WorkerConfig
from ovpool.errors import AuthenticationError, InferenceError, NotActiveError, OvpoolError
from ovpool.prefix_key import MAX_KEYS
from ovpool.protocol import (
    WORKER_WINDOW,
    Cancel,
    Credit,
    Disconnect,
    Error,
    Final,
    LoadFailed,
    Message,
    Partial,
    Ready,
    Request,
    completion_to_wire,
    decode,
    encode,
    load_to_wire,
    partial_of,
    route_keys_from_wire,
    sampling_from_wire,
    send_frames,
)
from ovpool.worker.backend import Backend, Failed, Finished, Token
from ovpool.worker.follow_ups import FollowUps
from ovpool.worker.kv_events import KvEventPublisher, topic
from ovpool.worker.link import BrokerLink
from ovpool.worker.prefix_report import PrefixReport

log = logging.getLogger(__name__)
# How long a LOAD_FAILED waits for the broker: the one `ovpool serve` starts beside this worker may
# take seconds to bind on a loaded host, and a worker that fails fast (a bad file: ~0.1 s) is there
# first. Only a worker that cannot load its model waits this, and only without a broker.
_REPORT_LINGER_S = 5.0
# How long after READY the idle work (seconds of kernel set-up) waits for the requests the broker
# dispatches at once: many round trips to a local broker, so the first token is not behind it.
_IDLE_AFTER_READY_S = timing.POLL_INTERVAL_S * 3


def worker_id(name: str) -> str:
    """How the broker and ``ovpool status`` name this process's worker: ``name@host:pid``."""
    return f"{name}@{_socket.gethostname()}:{os.getpid()}"


def report_load_failure(config: WorkerConfig, models: list[str], device: str, name: str | None,
                        exc: OvpoolError) -> None:
    """Tell the broker (config.broker; each of a standby pair) that this worker cannot load
    ``models`` and why (LOAD_FAILED), so `ovpool status` and the clients waiting for them say so.
    Best effort: a broker that does not take it within _REPORT_LINGER_S (not started yet, gone)
    is not waited for longer."""
    msg = LoadFailed(worker_id(name or models[0]), models, device, _socket.gethostname(), os.getpid(),
                     exc.code, str(exc))
    context = zmq.Context()
    try:
        for broker in endpoint.split(config.broker):  # the lingers run together, in term()
            sock = context.socket(zmq.DEALER)
            secure_peer(sock, config)
            sock.connect(broker)
            send_frames(sock, encode(msg), zmq.NOBLOCK)  # queued until the connection is up
            sock.close(linger=int(_REPORT_LINGER_S * 1000))
    except (zmq.ZMQError, OvpoolError) as err:
        log.warning("could not tell the broker that the model failed to load: %s", err)
    finally:
        context.term()


class Worker:
    """``with Worker(endpoint, backend) as w: w.run(stop_event)``; ``load_report`` (the Engine's)
    goes to the broker in READY."""

    def __init__(self, broker: str, backend: Backend, *, config: WorkerConfig = WorkerConfig(),
                 device: str = "CPU", name: str | None = None, load_report: dict | None = None):
        self.broker = endpoint.check(broker)
        self.backend = backend
        self.config = config
        host, pid = _socket.gethostname(), os.getpid()
        self.ready = Ready(worker_id=worker_id(name or backend.models[0]), models=backend.models,
                           device=device, slots=backend.slots, host=host, pid=pid,
                           load=load_to_wire(load_report))
        self._context = zmq.Context()
        self._link: BrokerLink | None = None
        self._active: dict[str, int] = {}  # request id -> the seq of its next PARTIAL
        self._credit = WORKER_WINDOW
        self._idle_pool = ThreadPoolExecutor(1, thread_name_prefix="worker-idle")
        self._idle_work: Future | None = None
        self._idle_due = True  # the backend's idle work runs once per idle period (Backend.idle)
        self._has_idle_work = True  # until idle() answers None: a thread hop per idle period for nothing
        self._idle_not_before = 0.0  # just registered: the broker may be dispatching queued requests
        self._deferred: dict[str, Request] = {}  # arrived while the idle work runs
        self._prefixes = PrefixReport(backend)
        self._follow_ups = FollowUps(config.follow_up_ms / 1000)
        self._refused = False  # the broker refused this worker's key as a worker's (said once)
        self._kv_events = (KvEventPublisher(config.kv_events_endpoint, topic(backend.models[0]))
                           if config.kv_events_endpoint else None)
        if self._kv_events is not None:  # block events are recorded only for a publisher
            backend.record_kv_events()

    def __enter__(self) -> Worker:
        if self._kv_events is not None:
            self._kv_events.__enter__()
        self._link = BrokerLink(self._context, self.broker, self.config, self.ready)
        self._link.start()
        self._registered()
        return self

    def _registered(self) -> None:
        """READY is sent. Requests queued for this model (one loaded on demand: they are why it
        started) come a round trip later; the idle work, which they would wait behind, waits
        that long first."""
        self._idle_not_before = time.monotonic() + _IDLE_AFTER_READY_S

    def __exit__(self, *exc: object) -> None:
        self._idle_pool.shutdown(wait=True)  # the backend is closed after us: let its warm-up end
        if self._link is not None:
            self._send(Disconnect(sorted([*self._active, *self._deferred])))
            self._drop_sessions()
            self._link.stop(linger_s=timing.HEARTBEAT_INTERVAL_S)
            self._link = None
        self._context.term()
        if self._kv_events is not None:
            self._kv_events.__exit__()

    def run(self, stop: threading.Event) -> None:
        log.info("worker %s serving %s with %d slots via %s", self.ready.worker_id, self.ready.models,
                 self.ready.slots, self.broker)
        next_heartbeat = 0.0
        link = self._link
        while not stop.is_set():
            now = time.monotonic()
            # First in the round, so the keeper has a heartbeat to repeat before any request
            # starts: one dispatched as READY arrives may hold the first step past the expiry.
            if now >= next_heartbeat:
                link.beat(encode(self._prefixes.heartbeat()))
                next_heartbeat = now + timing.HEARTBEAT_INTERVAL_S
            warming = self._warming()
            if self._idle_due and not warming and not self._active and not link.poll(0) \
                    and time.monotonic() >= self._idle_not_before:
                self._idle_work, self._idle_due = self._idle_pool.submit(self.backend.idle), False
                warming = True
            stepping = not warming and self._active and self._credit > 0
            # A chat's next turn, due a round trip after its answer ended, joins the next pass.
            hold = self._follow_ups.hold(time.monotonic()) if stepping else 0.0
            if link.poll(hold * 1000 if stepping else timing.POLL_INTERVAL_S * 1000):
                self._receive()
            if link.broker_silent(time.monotonic()):  # after reading what waited through a step
                self._reconnect()
            if not self._warming() and self._active and self._credit > 0 \
                    and not self._follow_ups.hold(time.monotonic()):
                self._step()

    def _warming(self) -> bool:
        """Whether the backend's idle work still runs; once it has ended, start what waited for it
        (and raise what it raised, as the inline call did)."""
        if self._idle_work is not None:
            if not self._idle_work.done():
                return True
            work, self._idle_work = self._idle_work, None
            more = work.result()
            self._has_idle_work = more is not None
            self._idle_due = bool(more)  # True: it has more for later in this idle period
        for msg in list(self._deferred.values()):
            del self._deferred[msg.request_id]
            self._start(msg)
        return False

    def _receive(self) -> None:
        for frames in self._link.receive():
            try:
                self._handle(decode(frames))
            except OvpoolError as exc:
                log.warning("dropped a message from the broker: %s", exc)
            except Exception as exc:  # a bug one message reaches must not stop the worker
                log.error("dropped a message from the broker that failed: %s: %s", type(exc).__name__, exc)

    def _handle(self, msg: Message) -> None:
        if isinstance(msg, Request):
            if msg.request_id in self._active or msg.request_id in self._deferred:
                log.warning("dropped a second REQUEST %r: it is already running", msg.request_id[:64])
                return
            self._deferred[msg.request_id] = msg
            self._warming()  # starts it at once unless the idle work runs
        elif isinstance(msg, Credit):  # never past the window: a broker returns what it took
            self._credit = min(self._credit + max(msg.tokens, 0), WORKER_WINDOW)
        elif isinstance(msg, Cancel):
            self._deferred.pop(msg.request_id, None)
            if self._active.pop(msg.request_id, None) is not None:
                self.backend.cancel(msg.request_id)
                self._prefixes.ended(msg.request_id)
        elif isinstance(msg, Disconnect):  # the broker does not know us (it restarted): start over
            log.info("broker asked %s to register again", self.ready.worker_id)
            self._drop_sessions()
            self._credit = WORKER_WINDOW
            self._send(self.ready)
            self._registered()
        elif isinstance(msg, Error) and msg.code == NotActiveError.code:
            self._link.refused()  # the passive one of a standby pair: its peer serves
        elif isinstance(msg, Error) and msg.code == AuthenticationError.code and not self._refused:
            # Without this line only the broker's log would say why this worker never serves.
            self._refused = True
            log.error("the broker refused this worker: %s", msg.message[:300])

    def _start(self, msg: Request) -> None:
        try:
            params = sampling_from_wire(msg.params)
            keys = route_keys_from_wire(msg.route_keys, MAX_KEYS)
            self.backend.add(msg.request_id, msg.prompt if msg.messages is None else msg.messages, params,
                             keys)
        except OvpoolError as exc:
            self._reply(Error(msg.request_id, exc.code, str(exc)))
            return
        except Exception as exc:  # a backend bug one request reaches fails that request only
            self._reply(Error(msg.request_id, InferenceError.code, f"cannot start the request: {exc}"))
            return
        self._active[msg.request_id] = 0
        self._follow_ups.arrived(time.monotonic())
        self._idle_due = self._has_idle_work  # for the idle period after it
        self._prefixes.started(msg, keys)

    def _step(self) -> None:
        active, start = self._active, time.monotonic()
        events = self.backend.step()
        now = time.monotonic()
        self._follow_ups.step(now - start)
        if self._kv_events is not None:
            self._kv_events.publish(*self.backend.kv_events(), time.time())
        for ev in events:
            rid = ev.request_id
            if isinstance(ev, Token):
                d, seq = ev.delta, active[rid]
                active[rid] = seq + 1
                self._reply(partial_of(rid, d, seq))
                continue
            sent = active.pop(rid)
            if isinstance(ev, Finished):
                self._prefixes.ended(rid, ev.completion.text)
                self._follow_ups.ended(ev.completion.usage, now)
                self._reply(Final(rid, completion_to_wire(ev.completion), sent))
            elif isinstance(ev, Failed):
                self._prefixes.ended(rid)
                self._reply(Error(rid, ev.error.code, str(ev.error)))

    def _reconnect(self) -> None:
        self._drop_sessions()
        self._credit = WORKER_WINDOW
        self._link.reconnect()

    def _drop_sessions(self) -> None:
        self._deferred.clear()  # the broker re-dispatches them
        self._follow_ups.drop()
        for rid in self._active:
            self.backend.cancel(rid)
        self._active.clear()
        self._prefixes.clear()

    def _reply(self, msg: Partial | Final | Error) -> None:
        """A reply about a request: it spends credit (it may go below zero by at most one step)."""
        self._credit -= 1
        self._send(msg)

    def _send(self, msg: Message) -> None:
        self._link.send(encode(msg))
