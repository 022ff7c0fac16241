"""A worker's link to the broker, on a thread of its own: the DEALER socket, the heartbeats both
ways and the reconnects, whatever the model is doing.

A zmq socket is not thread-safe, so the link thread owns the DEALER and nothing else touches it;
the worker loop talks to the link through an inproc PAIR pipe (``BrokerLink.pipe``), polled like
the DEALER was. Why a thread and not a shorter step: a forward pass, a kernel set-up or a
llguidance call is one C call that holds the loop for as long as it takes (seconds on a loaded
host), and no split of the loop can answer from inside it. The link needs no model state: the
loop hands it each heartbeat as it makes one (``HEARTBEAT``), sent at once; while the loop is busy,
the link sends the last one again, so the broker never declares a worker dead for a long step.

Frames on the pipe start with a kind: ``M`` a wire message (either way), ``H`` a heartbeat to send
(loop -> link), ``R`` the link reconnected (link -> loop: the broker re-dispatches the sessions,
drop them), ``A`` the loop has dropped them (until then the link discards the loop's messages,
which are about sessions of the old connection), ``S`` stop (loop -> link, after its last message).

A loop silent for ``STALL_EXPIRIES`` heartbeat expiries (60 s; no legitimate step is that long) is
presumed hung: the link stops heartbeating for it, so the broker re-dispatches its requests as for
a dead worker.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time

import zmq

from ovpool import timing
from ovpool.auth import secure_peer
from ovpool.protocol import Ready, encode, recv_frames, send_frames
from ovpool.settings import Settings

log = logging.getLogger(__name__)

MESSAGE, HEARTBEAT, RECONNECTED, ACK, STOP = b"M", b"H", b"R", b"A", b"S"
# The link sends the loop's last heartbeat again once the loop is this many intervals late with a
# new one: later than the loop's own interval (no duplicates while it keeps time), well within the
# expiry. A loop silent for STALL_EXPIRIES heartbeat expiries is presumed hung (timing.X is read at
# call time: tests shorten it).
_REPEAT_AFTER = 1.5
STALL_EXPIRIES = 20
_ids = itertools.count()


class BrokerLink:
    """``start()`` connects and sends ``ready``; the loop then uses ``pipe``; ``stop()`` after the
    loop's last message sends it, closes the DEALER and joins the thread."""

    def __init__(self, context: zmq.Context, broker: str, settings: Settings, ready: Ready):
        self.context, self.broker, self.settings, self.ready = context, broker, settings, ready
        address = f"inproc://ovpool-worker-link-{next(_ids)}"
        # The loop never waits to send (its replies are bounded by credit); what comes from the
        # broker has the default bound, past which the link drops it.
        self.pipe = context.socket(zmq.PAIR)
        self.pipe.linger, self.pipe.sndhwm = 0, 0
        self.pipe.bind(address)
        self._end = context.socket(zmq.PAIR)
        self._end.linger, self._end.rcvhwm = 0, 0
        self._end.connect(address)
        self._dealer: zmq.Socket | None = None
        self._backoff = timing.RECONNECT_MIN_S
        self._broker_expires = self._last_beat = self._loop_heard = 0.0
        self._heartbeat: list[bytes] | None = None
        self._discarding = False  # the loop's messages until it acknowledges a reconnect
        self._thread = threading.Thread(target=self._run, name="worker-link", daemon=True)

    def start(self) -> None:
        self._connect()
        self._thread.start()

    def stop(self) -> None:
        send_frames(self.pipe, [STOP])
        self._thread.join()
        self.pipe.close(linger=0)

    def _connect(self) -> None:
        if self._dealer is not None:
            self._dealer.close(linger=0)
        sock = self.context.socket(zmq.DEALER)
        sock.linger = 0
        sock.sndhwm = 0  # no libzmq limit: the credit bounds what is queued (WORKER_WINDOW + a step)
        secure_peer(sock, self.settings)
        sock.connect(self.broker)
        self._dealer = sock
        now = time.monotonic()
        self._broker_expires = now + timing.HEARTBEAT_EXPIRY_S + self._backoff
        self._loop_heard = now
        self._send(encode(self.ready))

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._end, zmq.POLLIN)
        try:
            while True:
                dealer = self._dealer  # a reconnect below replaces it
                poller.register(dealer, zmq.POLLIN)
                ready = dict(poller.poll(timing.POLL_INTERVAL_S * 1000))
                if self._end in ready and not self._from_loop():
                    return
                if dealer in ready:
                    self._from_broker()
                self._on_time(time.monotonic())
                poller.unregister(dealer)
        finally:  # every socket closed, or the worker's context.term() would wait forever
            self._dealer.close(linger=int(timing.HEARTBEAT_INTERVAL_S * 1000))
            self._end.close(linger=0)

    def _from_loop(self) -> bool:
        """Forward what the loop queued; False once it said stop (everything before it is sent)."""
        while True:
            try:
                kind, *frames = recv_frames(self._end)
            except zmq.Again:
                return True
            self._loop_heard = time.monotonic()
            if kind == STOP:
                return False
            if kind == ACK:
                self._discarding = False
            elif kind == HEARTBEAT:
                self._heartbeat = frames
                self._beat()
            elif kind == MESSAGE and not self._discarding:
                self._send(frames)

    def _from_broker(self) -> None:
        while True:
            try:
                frames = recv_frames(self._dealer)
            except zmq.Again:
                return
            self._broker_expires = time.monotonic() + timing.HEARTBEAT_EXPIRY_S
            self._backoff = timing.RECONNECT_MIN_S
            try:  # to a loop so far behind that its pipe is full (1,000 messages), drop it: the
                send_frames(self._end, [MESSAGE, *frames], zmq.NOBLOCK)  # broker's silence rules
            except zmq.Again:
                log.warning("the worker loop is behind: a message from the broker was dropped")

    def _on_time(self, now: float) -> None:
        if now >= self._broker_expires:
            self._reconnect()
            return
        late = now - self._last_beat >= _REPEAT_AFTER * timing.HEARTBEAT_INTERVAL_S
        hung = now - self._loop_heard >= STALL_EXPIRIES * timing.HEARTBEAT_EXPIRY_S
        if self._heartbeat is not None and late and not hung:
            self._beat()

    def _reconnect(self) -> None:
        log.warning("broker %s silent for %.1fs; reconnecting", self.broker, timing.HEARTBEAT_EXPIRY_S)
        self._backoff = min(self._backoff * 2, timing.RECONNECT_MAX_S)
        self._discarding = True
        # Before any message of the new connection; it waits for a loop whose pipe is full.
        send_frames(self._end, [RECONNECTED])
        self._connect()

    def _beat(self) -> None:
        self._last_beat = time.monotonic()
        self._send(self._heartbeat)

    def _send(self, frames: list[bytes]) -> None:
        # With no send limit (sndhwm 0) and a connected-or-connecting pipe, libzmq queues rather
        # than refusing; Again would mean no pipe at all, during a reconnect, whose messages the
        # broker re-dispatches anyway.
        try:
            send_frames(self._dealer, frames, zmq.NOBLOCK)
        except zmq.Again:
            log.warning("no connection to the broker: a message was not sent")
