"""A worker's DEALER socket to the broker, with a keeper thread that heartbeats while the worker
loop is busy.

The loop sends, receives and reconnects itself, as fast as before; a forward pass, a kernel set-up
or a llguidance call is one C call that holds the loop for as long as it takes (seconds on a
loaded host), and no split of the loop can answer from inside it. So the loop hands the link each
heartbeat as it makes one (``beat``, sent at once), and the keeper, waking every poll interval,
sends the last one again once the loop is 1.5 intervals late: the broker never declares a worker
dead for a long step. A zmq socket is not thread-safe, but one used by one thread at a time with
the memory barriers of a lock is (libzmq's rule for migrating a socket): every use holds
``_lock``. (A link thread owning the socket, fed through an inproc pipe, cost a thread switch per
message, which halved streamed tokens/s through the broker: docs/performance.md, link.py.)

The broker is presumed gone after HEARTBEAT_EXPIRY_S without a message; the loop asks
``broker_silent`` only after reading what waited, so a long step is not taken for silence, and a
message that waits unread is never silence (the loop may have been held after its read: a slow
request start, or a thread holding the GIL; a new worker at load 12 reconnected ~4 s after READY
for it, dropping its first request). A loop
that made no heartbeat for ``STALL_EXPIRIES`` expiries (60 s; no legitimate step is that long) is
presumed hung: the keeper stops for it, so the broker re-dispatches its requests as for a dead one.

``broker`` may list a standby pair's endpoints, comma-separated: each reconnect goes to the next
one, and a passive broker's refusal (``refused``) brings the reconnect forward.
"""

from __future__ import annotations

import logging
import threading
import time

import zmq

from ovpool import endpoint, timing
from ovpool.auth import secure_peer
from ovpool.protocol import Ready, encode, recv_frames, send_frames
from ovpool.settings import Settings

log = logging.getLogger(__name__)

# In heartbeat intervals and expiries: timing.X is read at call time (tests shorten it).
_LATE_INTERVALS = 1.5
STALL_EXPIRIES = 20


class BrokerLink:
    """``start()`` connects (sending ``ready``) and starts the keeper; ``stop(linger_s)`` ends both."""

    def __init__(self, context: zmq.Context, broker: str, settings: Settings, ready: Ready):
        self.context, self.settings, self.ready = context, settings, ready
        self.brokers = endpoint.split(broker)
        self.broker = self.brokers[0]  # the one connected now
        self._lock = threading.Lock()
        self._socket: zmq.Socket | None = None
        self._backoff = timing.RECONNECT_MIN_S
        self._broker_expires = self._beat_sent = self._loop_beat = 0.0
        self._heartbeat: list[bytes] | None = None
        self._stopping = threading.Event()
        self._keeper = threading.Thread(target=self._keep, name="worker-heartbeat", daemon=True)

    def start(self) -> None:
        self._connect()
        self._keeper.start()

    def stop(self, linger_s: float) -> None:
        self._stopping.set()
        self._keeper.join()
        with self._lock:
            self._socket.close(linger=int(linger_s * 1000))

    def poll(self, timeout_ms: float) -> bool:
        with self._lock:
            return bool(self._socket.poll(timeout_ms))

    def receive(self) -> list[list[bytes]]:
        """Every message waiting, in order."""
        out = []
        with self._lock:
            while True:
                try:
                    out.append(recv_frames(self._socket))
                except zmq.Again:
                    break
        if out:
            self._broker_expires = time.monotonic() + timing.HEARTBEAT_EXPIRY_S
            self._backoff = timing.RECONNECT_MIN_S
        return out

    def send(self, frames: list[bytes]) -> None:
        # With no send limit (sndhwm 0) and a connected-or-connecting pipe, libzmq queues rather
        # than refusing; Again would mean no pipe at all, during a reconnect, whose messages the
        # broker re-dispatches anyway.
        with self._lock:
            try:
                send_frames(self._socket, frames, zmq.NOBLOCK)
            except zmq.Again:
                log.warning("no connection to the broker: a message was not sent")

    def beat(self, frames: list[bytes]) -> None:
        """The loop's heartbeat: sent now, and again by the keeper while the loop is busy."""
        self._heartbeat, self._loop_beat = frames, time.monotonic()
        self._send_heartbeat()

    def broker_silent(self, now: float) -> bool:
        return now >= self._broker_expires and not self.poll(0)

    def refused(self) -> None:
        """The broker is the passive one of a pair: reconnect (to the next) soon, not at expiry."""
        self._broker_expires = min(self._broker_expires, time.monotonic() + timing.RECONNECT_MIN_S)

    def reconnect(self) -> None:
        old = self.broker
        self.broker = self.brokers[(self.brokers.index(old) + 1) % len(self.brokers)]
        log.warning("broker %s silent or passive; reconnecting to %s", old, self.broker)
        self._backoff = min(self._backoff * 2, timing.RECONNECT_MAX_S)
        self._connect()

    def _connect(self) -> None:
        sock = self.context.socket(zmq.DEALER)
        sock.linger = 0
        sock.sndhwm = 0  # no libzmq limit: the credit bounds what is queued (WORKER_WINDOW + a step)
        secure_peer(sock, self.settings)
        sock.connect(self.broker)
        with self._lock:
            if self._socket is not None:
                self._socket.close(linger=0)
            self._socket = sock
        self._broker_expires = time.monotonic() + timing.HEARTBEAT_EXPIRY_S + self._backoff
        self.send(encode(self.ready))

    def _keep(self) -> None:
        while not self._stopping.wait(timing.POLL_INTERVAL_S):
            now = time.monotonic()
            late = now - self._beat_sent >= _LATE_INTERVALS * timing.HEARTBEAT_INTERVAL_S
            hung = now - self._loop_beat >= STALL_EXPIRIES * timing.HEARTBEAT_EXPIRY_S
            if self._heartbeat is not None and late and not hung:
                self._send_heartbeat()

    def _send_heartbeat(self) -> None:
        self._beat_sent = time.monotonic()
        self.send(self._heartbeat)
