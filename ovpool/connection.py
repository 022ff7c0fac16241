"""A client's connection to its broker as the socket monitor reports it, pure (time passed in):
whether a handshake completed, since when the connection is down, and, when none came within
connect_timeout_s, why as far as this side can tell. ovpool.pending.PendingRequests owns one.
"""

from __future__ import annotations

from ovpool import errors


class Connection:
    """``broker`` names the endpoint in errors; ``timeout_s`` is how long a request waits for a
    connection to it (setting connect_timeout_s); ``curve``: CURVE keys are in use, so a handshake
    that never completes may be a key mismatch (said only then)."""

    def __init__(self, now: float, broker: str, timeout_s: float, curve: bool):
        self.broker, self.timeout_s, self._curve = broker, timeout_s, curve
        # Up once a handshake succeeded; was up, or saw a TCP connection, since the last move.
        self.up, self._was_up, self._tcp, self.down_since = False, False, False, now

    def link(self, up: bool, now: float, tcp: bool = False) -> None:
        """The socket monitor's news: the handshake succeeded (``up``), the connection dropped, or
        (``tcp``) a TCP connection opened whose handshake has not completed yet."""
        if up:
            self.up = self._was_up = True
        elif tcp:
            self._tcp = True
        elif self.up:  # only a drop restarts the clock: a peer that keeps closing on us must not
            self.up, self.down_since = False, now

    def lost(self, now: float, since: float = float("-inf")) -> bool:
        """No connection for connect_timeout_s (counted from ``since`` at the earliest)."""
        return not self.up and now - max(self.down_since, since) >= self.timeout_s

    def moved(self, broker: str, now: float) -> None:
        """The client now talks to ``broker``: no connection to it yet."""
        self.broker = broker
        self.up = self._was_up = self._tcp = False
        self.down_since = now

    def unreachable(self) -> errors.BrokerUnavailableError:
        """Why no connection came within connect_timeout_s, as far as this side can tell: a broker
        this client was connected to is lost (BrokerLostError), else it was never reached."""
        b, t = self.broker, self.timeout_s
        if self._was_up:
            return errors.BrokerLostError(
                f"lost the connection to the broker at {b} and it did not come back in {t:g} s: its"
                " process exited or was killed (one stopped by SIGTERM or Ctrl-C would have said so);"
                " start `ovpool serve` (or `ovpool broker`) again and resend (setting connect_timeout_s:"
                " how long a restart may take)")
        if self._tcp:
            what = f"{b} accepts connections but no ovpool handshake completed in {t:g} s"
        else:
            what = f"cannot reach the broker at {b}: no connection in {t:g} s"
        hint = "; is `ovpool serve` (or `ovpool broker`) running there?"
        if self._curve:
            hint += (" With CURVE, curve_server_key must hold that broker's public key and its"
                     " curve_allowed_keys this client's")
        return errors.BrokerUnavailableError(f"{what}{hint} (setting connect_timeout_s)")
