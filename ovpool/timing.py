"""Every timing constant of the pool, derived from each other in one place.

A peer is declared dead after ``HEARTBEAT_LIVENESS`` missed heartbeats, so expiry is
interval × liveness; reconnect backoff and polling are fractions of the same interval so the
whole pool speeds up or slows down together (tests shorten ``HEARTBEAT_INTERVAL_S`` via the
environment variable ``OVPOOL_HEARTBEAT_INTERVAL_S``).
"""

from __future__ import annotations

import os

HEARTBEAT_INTERVAL_S: float = float(os.environ.get("OVPOOL_HEARTBEAT_INTERVAL_S", "1.0"))
HEARTBEAT_LIVENESS: int = 3
HEARTBEAT_EXPIRY_S: float = HEARTBEAT_INTERVAL_S * HEARTBEAT_LIVENESS

# The zmq loops wake at least this often to run timers (heartbeats, deadlines).
POLL_INTERVAL_S: float = HEARTBEAT_INTERVAL_S / 10

# Worker reconnect backoff after the broker goes silent: doubles from MIN up to MAX.
RECONNECT_MIN_S: float = HEARTBEAT_INTERVAL_S / 4
RECONNECT_MAX_S: float = HEARTBEAT_EXPIRY_S * 2
