"""Every timing constant of the pool, derived from each other in one place.

A peer is declared dead after ``HEARTBEAT_LIVENESS`` missed heartbeats, so expiry is
interval × liveness; reconnect backoff and polling are fractions of the same interval so the
whole pool speeds up or slows down together (tests shorten ``HEARTBEAT_INTERVAL_S`` via the
registered environment variable ``OVPOOL_HEARTBEAT_INTERVAL_S``, ovpool.settings.VARIABLES).
"""

from __future__ import annotations

from ovpool.settings import heartbeat_interval_s

HEARTBEAT_INTERVAL_S: float = heartbeat_interval_s()
HEARTBEAT_LIVENESS: int = 3
HEARTBEAT_EXPIRY_S: float = HEARTBEAT_INTERVAL_S * HEARTBEAT_LIVENESS

# The zmq loops wake at least this often to run timers (heartbeats, deadlines).
POLL_INTERVAL_S: float = HEARTBEAT_INTERVAL_S / 10

# Worker reconnect backoff after the broker goes silent: doubles from MIN up to MAX.
RECONNECT_MIN_S: float = HEARTBEAT_INTERVAL_S / 4
RECONNECT_MAX_S: float = HEARTBEAT_EXPIRY_S * 2

# `ovpool serve` supervision. A worker that exits before it is ready, or within STABLE_AFTER_S of
# starting, failed "fast"; its restart waits BACKOFF_MIN_S doubling up to BACKOFF_MAX_S, and after
# GIVE_UP_AFTER fast failures in a row it is reported failing and left stopped (a cache-only miss or a
# bad model path fails the same way every time, so retrying only fills the log).
SUPERVISOR_BACKOFF_MIN_S: float = HEARTBEAT_INTERVAL_S / 2
SUPERVISOR_BACKOFF_MAX_S: float = HEARTBEAT_EXPIRY_S * 10
SUPERVISOR_STABLE_AFTER_S: float = HEARTBEAT_EXPIRY_S * 10
SUPERVISOR_GIVE_UP_AFTER: int = 5
# The broker forgets a host's supervisor report (``ovpool status`` "supervised") after this long
# without a new one (serve sends one every half heartbeat interval).
SUPERVISED_EXPIRY_S: float = HEARTBEAT_EXPIRY_S * 3
# How long a child may take to exit after SIGTERM before it gets SIGKILL.
SHUTDOWN_GRACE_S: float = HEARTBEAT_EXPIRY_S

# A restarted broker queues requests for models it has not seen yet for this long, so that
# workers can register again before clients get ModelNotFound; an orphaned queue (no live worker
# for its model) fails after the same grace.
BROKER_GRACE_S: float = HEARTBEAT_EXPIRY_S * 5

# An HTTP request (head and body) must arrive within this long of its connection being ready
# for it (ovpool.api.peer_bounds): longer than any honest client takes, short enough that slow
# senders cannot hold connections for ever.
HTTP_READ_TIMEOUT_S: float = HEARTBEAT_EXPIRY_S * 20
# A response whose client takes none of it for this long is cut (its connection aborted).
HTTP_WRITE_STALL_S: float = HTTP_READ_TIMEOUT_S

# A client fails its requests with BrokerUnavailable after hearing nothing for this long.
CLIENT_UNAVAILABLE_S: float = HEARTBEAT_EXPIRY_S * 10
