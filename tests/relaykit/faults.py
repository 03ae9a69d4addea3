"""FaultRelay: the network between kipside and the broker, failing on the test's command.

Tansu keeps its data in memory only, so the broker itself is never restarted: this relay sits
between kipside and the real Tansu and fails the path instead, while the broker keeps every
record. What a test can do to the path, from its own thread, while traffic flows:

- `cut()`: the broker's port refuses new connections (RST to the SYN) and every connection
  carried is reset (RST), as when a broker dies or a router in between reboots;
  `restore()` listens again on the same port.
- `blackhole()`: a silent partition. Connections stay open, new ones are accepted, and every
  byte in either direction vanishes, so only a timeout can notice. `restore()` lets new
  connections through; a connection that lived through the blackhole never carries a byte
  again (its bytes are gone, as across a partition after which the broker has forgotten the
  connection), so whoever holds it must time it out.
- `stall()` / `resume()`: requests stop at the relay and go on, none lost, when resumed (a broker
  that stops reading for a while: GC pause, full disk, overloaded controller).
- `spike(ms)` / `calm()`: every response is late by `ms` (a latency spike), none lost.

It counts, independently of kipside, what it swallowed (`swallowed()`), and the base relay
counts connections and cuts (`link_counts()`). It binds and dials loopback only and never
changes a byte it forwards. Its hooks pass what they do not swallow on to the next class in
the MRO, so it composes with a simulating relay: `class X(FaultRelay, MarkerWindowRelay)`,
whose __init__ runs the other relay's __init__ and then `_init_faults()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Relay
from .decisions import DROP, Conn, Decision, Request


@dataclass(frozen=True, slots=True)
class Swallowed:
    """What the blackhole ate: requests and responses that never reached the other side."""

    requests: int
    responses: int


class FaultRelay(Relay):
    """A relay whose path to the broker the test cuts, blackholes, stalls or slows."""

    def __init__(self, upstream: tuple[str, int] | None = None) -> None:
        super().__init__(upstream)
        self._init_faults()

    def _init_faults(self) -> None:
        self._blackhole = False
        self._dark: set[int] = set()  # connections that lived through a blackhole
        self._swallowed_requests = 0
        self._swallowed_responses = 0

    # Control (test thread) ---------------------------------------------------------------

    def cut(self) -> int:
        """Refuse new connections and reset every open one; returns how many were reset."""
        self.stop_accepting()
        return self.cut_all()

    def blackhole(self) -> None:
        """Swallow every byte of every connection, open or new, in both directions."""
        self._call(self._start_blackhole)

    def restore(self) -> None:
        """End a cut or a blackhole: new connections reach the broker again."""
        self._call(self._end_blackhole)
        self.accept_again()

    def stall(self) -> None:
        """Requests wait at the relay (none lost) until resume()."""
        self.hold()

    def resume(self) -> None:
        self.release()

    def spike(self, latency_ms: float) -> None:
        """Every response is late by latency_ms from now on, until calm()."""
        self.response_delay_ms = latency_ms

    def calm(self) -> None:
        self.response_delay_ms = 0.0

    def swallowed(self) -> Swallowed:
        with self._lock:
            return Swallowed(self._swallowed_requests, self._swallowed_responses)

    # Hooks and helpers (trio thread) -----------------------------------------------------

    def _start_blackhole(self) -> None:
        self._blackhole = True
        self._dark.update(self._live)

    def _end_blackhole(self) -> None:
        self._blackhole = False

    def on_open(self, conn: Conn) -> None:
        if self._blackhole:
            self._dark.add(conn.number)
        super().on_open(conn)

    def on_close(self, conn: Conn) -> None:
        self._dark.discard(conn.number)
        super().on_close(conn)

    def on_request(self, conn: Conn, request: Request) -> Decision:
        if conn.number in self._dark:
            with self._lock:
                self._swallowed_requests += 1
            return DROP
        return super().on_request(conn, request)

    def on_response(self, conn: Conn, request: Request, frame: bytes) -> bytes | None:
        if conn.number in self._dark:
            with self._lock:
                self._swallowed_responses += 1
            return None
        return super().on_response(conn, request, frame)
