"""What one client, and all clients together, may make kipside hold, and what reaching a limit does.

The rule file's ``limits`` section (kipside.rules.Limits), read per event so that a reload
applies at once:

- **In-flight bytes.** A client's in-flight bytes are its requests that kipside has read and not
  yet answered (queued on a lane, held, waiting on a broker) plus its answers that its socket
  has not taken yet. Past ``max_in_flight_bytes_per_client`` kipside stops reading that
  client's requests until the figure drops: the client's socket buffer fills and TCP pushes
  back, as a broker mutes a connection. Past ``max_in_flight_bytes`` for all clients together,
  kipside stops reading the clients holding more than an equal share of it
  (``max_in_flight_bytes / open client connections``). Not all of them: one client flooding
  kipside would then stall every other. Not only the very largest: finding it means a scan of
  every client per read, and pausing every client above the share brings the total down as
  fast. A client with less than its share (a producer with its few requests out) keeps being
  read, and requests already read keep flowing for everyone, paused or not.
- **What kipside decodes** (``max_partitions_per_request``, ``max_tagged_fields``,
  ``max_tagged_field_bytes``): the caps handed to kipside.protocol's readers of request
  headers and coalesced ProduceRequests (`ClientLimits.decode`); a request over one is refused
  and its connection closed.
- **Frames** (``max_frame_bytes``, kipside.protocol's FrameDecoder) and **timeouts**
  (core.deadlines) are enforced there; they are reported here.
- **Connections** (``max_connections``): `ServerLimits.admit`.

Every limit reached is counted (kipside_limit_reached_total{limit="KEY"}) and logged by
`LimitReporter`: one line naming the client, the key and what to do, at most one line per key
every LOG_INTERVAL_SECONDS so a flood does not flood the log.

Sans-I/O: this module counts and decides; the session's driver waits (it stops reading a client
while `over()` says so, and `on_room` tells it when to look again) and closes what must close.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import fields
from typing import Any, Final

from kipside.protocol import (
    Address,
    DecodeLimits,
    FrameTooLargeError,
    LimitExceeded,
    api_name,
)
from kipside.proxy.core.deadlines import IDLE, Deadlines
from kipside.proxy.telemetry.stats import Stats
from kipside.rules import Limits, RuleSet

ReportLimit = Callable[[str, str], None]
"""(limit key, message): LimitReporter.reached, counted and logged."""

__all__ = [
    "IN_FLIGHT",
    "IN_FLIGHT_PER_CLIENT",
    "LOG_INTERVAL_SECONDS",
    "REQUEST_OVERHEAD_BYTES",
    "ClientLimits",
    "LimitReporter",
    "ReportLimit",
    "ServerLimits",
    "answer_too_large",
]

log = logging.getLogger("kipside.limits")

LOG_INTERVAL_SECONDS: Final = 10.0
IN_FLIGHT: Final = "max_in_flight_bytes"
IN_FLIGHT_PER_CLIENT: Final = "max_in_flight_bytes_per_client"
# What a request in flight costs kipside beyond its bytes (its slot, its Pending, the broker
# connection's entry, callbacks: about this much of Python objects), counted so that a flood of
# tiny requests is bounded too.
REQUEST_OVERHEAD_BYTES: Final = 512
# Every limit but max_frame_bytes (a connection's frame reader keeps the cap it was made with;
# operations.reload logs that one).
_RELOADED_AT_ONCE: Final = tuple(
    f.name for f in fields(Limits) if f.init and f.name != "max_frame_bytes"
)
# kipside.protocol.DecodeLimits' fields, as the rule file names them.
_DECODE_KEYS: Final = {
    "max_tagged_fields": "max_tagged_fields",
    "max_tagged_field_bytes": "max_tagged_field_bytes",
    "max_partitions": "max_partitions_per_request",
}


def answer_too_large(connection: str, request: str | None, size: int, cap: int) -> str:
    """What a broker connection closed for an answer over limits.max_frame_bytes says."""
    to = f" to {request}" if request else ""
    return (
        f"{connection}: the broker sent a response{to} of {size} bytes, over "
        f"limits.max_frame_bytes ({cap}): closing the connection (the requests in flight on "
        "it fail and their clients retry, and would meet it again). Raise "
        "limits.max_frame_bytes above the largest answer the brokers send: a Fetch answer "
        "reaches the consumer's fetch.max.bytes (50 MiB by default) and more"
    )


class LimitReporter:
    """Counts every limit reached, by key, and logs it: at most one line per key every
    `interval` seconds, the next line saying how many went unlogged in between."""

    def __init__(
        self,
        stats: Stats,
        *,
        interval: float = LOG_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stats = stats
        self._interval = interval
        self._clock = clock
        self._logged_at: dict[str, float] = {}
        self._unlogged: Counter[str] = Counter()

    def reached(self, key: str, message: str, *, level: int = logging.WARNING) -> None:
        """Limit `key` (a key of the rules' limits section) was reached; `message` says who,
        what, and what to do."""
        self.stats.limit_reached[key] += 1
        now = self._clock()
        last = self._logged_at.get(key)
        if last is not None and now - last < self._interval:
            self._unlogged[key] += 1
            return
        self._logged_at[key] = now
        unlogged = self._unlogged.pop(key, 0)
        if unlogged and last is not None:
            message += f" ({unlogged} more of limits.{key} in the last {now - last:.0f} s unlogged)"
        log.log(level, "%s", message)


class ServerLimits:
    """The limits of one server: the rules' limits section, the count of what all clients
    hold, and the one reporter."""

    def __init__(self, limits: Callable[[], Limits], stats: Stats) -> None:
        self.limits = limits
        """The limits in force (read per event)."""
        self.current = limits()
        """The limits in force as of the last reload (`rules_changed`): what the per-request
        checks read, with no call."""
        self.stats = stats
        self.reporter = LimitReporter(stats)
        self.clients = 0
        """Open ClientLimits: the divisor of a client's equal share of max_in_flight_bytes."""
        self.peak_in_flight = 0
        """The largest total held since start (for tests and bench/)."""
        self._waiting: set[ClientLimits] = set()
        """Clients paused by the total, woken when it is back under the limit."""
        self._sessions: set[ClientLimits] = set()

    def admit(self, peername: Callable[[], Any]) -> bool:
        """Whether a new client connection may be served (max_connections); reports if not.
        `peername`: the socket's getpeername, called only to name a refused client."""
        limit = self.limits().max_connections
        open_now = self.stats.client_connections
        if open_now < limit:
            return True
        try:
            host, port = peername()[:2]
            peer = str(Address(host, port))
        except OSError:  # gone already
            peer = "(disconnected)"
        self.reporter.reached(
            "max_connections",
            f"refusing client {peer}: {open_now} client connections are open, "
            f"limits.max_connections is {limit}; closing it at once. Raise "
            "limits.max_connections in the rule file if this many clients are expected",
        )
        return False

    def client(self, describe: Callable[[], str], now: float) -> ClientLimits:
        """The limits of one client connection, counted here until its `close()`; `now`
        starts its idle clock."""
        return ClientLimits(self, describe, now)

    def rules_changed(self, old: RuleSet, new: RuleSet) -> None:
        """After a reload (operations.reload's on_applied): every paused client checks its
        in-flight limits again, every connection its deadlines, under the new limits."""
        self.current = self.limits()
        for key in _RELOADED_AT_ONCE:
            before, after = getattr(old.limits, key), getattr(new.limits, key)
            if before != after:
                log.info("limits.%s changed from %d to %d: in force now", key, before, after)
        for client in list(self._sessions):
            client.recheck()

    def _released(self) -> None:
        # Only while someone waits on the total (rare): one comparison per release otherwise.
        if self._waiting and self.stats.in_flight_bytes <= self.limits().max_in_flight_bytes:
            for client in list(self._waiting):
                client.wake()


class ClientLimits:
    """One client connection's share of the limits: what it holds, its request caps and
    deadlines.

    The driver calls `over()` before each request it reads (and stops reading while it says a
    limit), `took()` per request read, `arrived()` per answer that came, `written()` per
    answers written, `backlog_changed()` as the socket's unsent backlog grows and shrinks,
    `read()` after each read from the socket, and `close()` at its end. `on_room` is called
    whenever what the client holds drops while the driver waits for room (`waiting`).
    """

    __slots__ = (
        "_closed",
        "_describe",
        "_server",
        "_took_since_read",
        "_total_waits",
        "backlog",
        "deadlines",
        "held",
        "on_deadline_sooner",
        "on_recheck",
        "on_room",
        "waiting",
    )

    def __init__(self, server: ServerLimits, describe: Callable[[], str], now: float) -> None:
        self._server = server
        self._describe = describe
        self._closed = False
        self._took_since_read = False
        self.held = 0
        """Bytes held for this client, its in-flight figure: requests read and not yet
        answered, answers that came and are not yet written (some wait behind an earlier one:
        answers leave in request order), and `backlog`."""
        self.backlog = 0
        """Bytes of answers written that the client's socket has not taken (it is not reading)."""
        self.deadlines = Deadlines(server.limits, lambda: self.held > 0, now)
        self.on_room: Callable[[], None] | None = None
        """Called when what the client holds drops while the driver waits for room."""
        self.waiting = 0
        """How many of the driver's tasks wait for room (`wait`)."""
        self._total_waits = 0
        self.on_recheck: Callable[[], None] | None = None
        """Called when the limits may have changed (a reload): deadlines are decided again."""
        self.on_deadline_sooner: Callable[[], None] | None = None
        """Called when a deadline may have come nearer (a request started arriving)."""
        server.clients += 1
        server._sessions.add(self)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def report(self) -> Callable[[str, str], None]:
        """The server's LimitReporter.reached (for this client's own broker connection)."""
        return self._server.reporter.reached

    @property
    def decode(self) -> DecodeLimits:
        """The caps kipside's readers apply to this client's requests."""
        return self._server.current.decode_limits

    # Counting -------------------------------------------------------------------------

    def took(self, size: int) -> int:
        """A request of `size` bytes was read; returns what it counts for (its bytes and
        kipside's bookkeeping), held until its answer is `written`."""
        size += REQUEST_OVERHEAD_BYTES
        self._took_since_read = True
        if self._closed:
            return 0
        self.held += size
        self._add(size)
        return size

    def arrived(self, size: int) -> None:
        """An answer of `size` bytes came; held until `written` (and then while the socket
        has not taken it)."""
        if self._closed:
            return
        self.held += size
        self._add(size)

    def written(self, now: float, request_bytes: int, answer_bytes: int) -> None:
        """Answers went to the socket: their requests and themselves are held no more (what
        the socket did not take comes back through the backlog)."""
        self.deadlines.wrote(now)
        if self._closed:
            return
        self.held -= request_bytes + answer_bytes
        self._release(request_bytes + answer_bytes)

    def backlog_changed(self, delta: int) -> None:
        """The socket's unsent backlog grew (delta > 0) or shrank."""
        if self._closed:
            return
        self.backlog += delta
        self.held += delta
        if delta > 0:
            self._add(delta)
        else:
            self._release(-delta)

    def _add(self, size: int) -> None:
        stats = self._server.stats
        stats.in_flight_bytes += size
        if stats.in_flight_bytes > self._server.peak_in_flight:
            self._server.peak_in_flight = stats.in_flight_bytes

    def _release(self, size: int) -> None:
        if not size:
            return
        self._server.stats.in_flight_bytes -= size
        if self.waiting:
            self.wake()
        self._server._released()

    def read(self, now: float, partial_bytes: int) -> None:
        """After a read and every whole request in it; `partial_bytes` of the next are in."""
        if self.deadlines.read(now, partial_bytes, self._took_since_read):
            self._deadline_sooner()
        self._took_since_read = False

    def _deadline_sooner(self) -> None:
        if self.on_deadline_sooner is not None:
            self.on_deadline_sooner()

    # Backpressure ---------------------------------------------------------------------

    def over(self, held: int | None = None) -> str | None:
        """The in-flight limit this client (or `held` bytes of it) is over, if any. Called
        before each request read: two comparisons when under both limits."""
        if held is None:
            held = self.held
        server = self._server
        limits = server.current
        if held <= limits.max_in_flight_bytes_per_client and (
            server.stats.in_flight_bytes <= limits.max_in_flight_bytes
        ):
            return None
        if held > limits.max_in_flight_bytes_per_client:
            return IN_FLIGHT_PER_CLIENT
        # Over an equal share of the total limit: held > limit / clients.
        if held * server.clients > limits.max_in_flight_bytes:
            return IN_FLIGHT
        return None

    def pausing(self, reason: str) -> None:
        """The driver stops reading this client's requests over `reason` (a limit's key)."""
        self._report_pause(reason)
        self._server.stats.paused_client_connections += 1
        self.deadlines.pause()

    def resuming(self, now: float, partial_bytes: int) -> None:
        """The driver reads this client's requests again."""
        self._server.stats.paused_client_connections -= 1
        self.deadlines.resume(now, partial_bytes)
        self._deadline_sooner()

    def wait(self, on_total: bool, waiting: bool) -> None:
        """A task of the driver starts (`waiting`) or stops waiting for room; `on_total`: for
        the total of every client to drop, as well as its own."""
        self.waiting += 1 if waiting else -1
        if on_total:
            self._total_waits += 1 if waiting else -1
            if self._total_waits:
                self._server._waiting.add(self)
            else:
                self._server._waiting.discard(self)

    def wake(self) -> None:
        """Whoever waits on this client's limits should check them again."""
        if self.on_room is not None:
            self.on_room()

    def recheck(self) -> None:
        """The limits may have changed: check them, and the deadlines, again."""
        self.wake()
        if self.on_recheck is not None:
            self.on_recheck()

    def _report_pause(self, key: str) -> None:
        limits = self._server.limits()
        who = self._describe()
        if key == IN_FLIGHT_PER_CLIENT:
            message = (
                f"{who} has {self.held} bytes in flight (requests not yet answered, answers "
                f"it has not read), over limits.{key} ({limits.max_in_flight_bytes_per_client}): "
                "its requests are not read until that drops. Raise the limit if the client "
                "is meant to have this much outstanding; otherwise it is not reading its "
                "answers or sends faster than the brokers answer"
            )
        else:
            share = limits.max_in_flight_bytes // max(self._server.clients, 1)
            message = (
                f"kipside holds {self._server.stats.in_flight_bytes} bytes in flight for "
                f"{self._server.clients} client connections, over limits.{key} "
                f"({limits.max_in_flight_bytes}); {who} holds {self.held}, more than an equal "
                f"share ({share}): its requests are not read until the total drops. Raise "
                "the limit if memory allows, or look for clients that send without reading"
            )
        self._server.reporter.reached(key, message)

    # Refusals and timeouts --------------------------------------------------------------

    def refused(self, exc: FrameTooLargeError | LimitExceeded, frame: bytes | None) -> None:
        """Report a request over a cap; the session closes the connection."""
        who = self._describe()
        if isinstance(exc, FrameTooLargeError):
            self._server.reporter.reached(
                "max_frame_bytes",
                f"{who} sent a request of frame size {exc.size}, over limits.max_frame_bytes "
                f"(a cap of {exc.cap} bytes): closing the connection. Raise it if "
                "requests this large are intended (and keep the client's max request size "
                "below it: message.max.bytes, max.request.size)",
            )
            return
        key = _DECODE_KEYS.get(exc.limit, exc.limit)
        what = "a request"
        if frame is not None and len(frame) >= 8:
            name = api_name(int.from_bytes(frame[4:6], "big"))
            what = f"{'an' if name[0] in 'AEIOU' else 'a'} {name} request"
        self._server.reporter.reached(
            key,
            f"{who} sent {what} over limits.{key} ({exc}): closing the connection. Raise "
            f"limits.{key} if the client is legitimate",
        )

    def expired(self, key: str, seconds: float) -> None:
        """Report a deadline that expired; the driver closes the connection."""
        partial_bytes = self.deadlines.partial_bytes
        who = self._describe()
        if key == IDLE:
            self._server.reporter.reached(
                key,
                f"{who} sent no request for {seconds:.1f} s and is owed no answer: closing "
                f"the idle connection (limits.{key} = {self._server.limits().idle_timeout_ms}); "
                "Kafka clients reconnect when they next need to. Set it to 0 to keep idle "
                "connections open",
                level=logging.INFO,
            )
        else:
            self._server.reporter.reached(
                key,
                f"{who} began a request {seconds:.1f} s ago and has sent {partial_bytes} bytes "
                f"of it: closing the connection (limits.{key} = "
                f"{self._server.limits().request_read_timeout_ms}). A client stalling on "
                "purpose (slowloris) or a very slow network; raise the limit if the clients' "
                "links are this slow",
            )

    def close(self) -> None:
        """The connection ended: whatever it held is released."""
        if self._closed:
            return
        held = self.held
        self.held = self.backlog = 0
        self._closed = True
        self.wake()
        server = self._server
        server.stats.in_flight_bytes -= held
        server.clients -= 1
        server._sessions.discard(self)
        server._waiting.discard(self)
        # Fewer clients: everyone's equal share grew.
        for client in list(server._waiting):
            client.wake()
