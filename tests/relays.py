"""TCP relays the integration tests put between kipside and the broker.

CountingRelay forwards every byte unchanged, in both directions, between whoever dials it (kipside)
and one broker address, and independently of kipside counts what goes upstream: connections
(open now, peak concurrently open, total accepted), requests by API key, and the CRC of every
record batch in every ProduceRequest it forwards. It can also hold the client->broker direction
(so requests stay in flight) and cut every connection it carries (a broker/network failure).

One deliberate exception to "unchanged", off by default: with `kafka_acks0=True` the relay swallows
the broker's responses to acks=0 ProduceRequests. Tansu 0.6.0 answers acks=0 requests (seen here:
raw socket, no proxy), Apache Kafka never does (an acks=0 produce has no response); the option makes
the test broker behave like Apache Kafka on this point. Either way the relay counts those answers
(`acks0_answers`), so a test can show that the broker did answer.

It is a filter on tests/relaykit's Relay, which runs trio in a background thread; every public
method is called from the test's thread and is safe to call while traffic flows. It binds and
dials loopback only, and never re-encodes a byte: frames are parsed only to be counted.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from relaykit.base import Relay
from relaykit.decisions import FORWARD, Conn, Decision, Request

from kipside.protocol.apis import ApiKey
from kipside.protocol.errors import ProtocolError
from kipside.protocol.headers import parse_request_header
from kipside.protocol.produce import MAX_VERSION, MIN_VERSION, parse_produce_request
from kipside.protocol.records import RecordBatchError, iter_batches
from kipside.proxy.session.peek import produce_acks


@dataclass(frozen=True, slots=True)
class BatchSeen:
    """One record batch of one ProduceRequest, as it passed the relay."""

    topic: str
    partition: int
    crc: int
    crc_valid: bool
    acks: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    compression: int


def produce_batches(frame: bytes) -> list[BatchSeen]:
    """Every record batch in a ProduceRequest frame (size prefix included), in request order.

    Raises ProtocolError / RecordBatchError if the frame is not a readable v3+ ProduceRequest.
    """
    header = parse_request_header(frame)
    if header.api_key != ApiKey.PRODUCE:
        raise ValueError(f"api key {header.api_key} is not Produce")
    if not MIN_VERSION <= header.api_version <= MAX_VERSION:
        raise ValueError(f"Produce v{header.api_version} has no magic-v2 record batches")
    request = parse_produce_request(frame, header.body_offset, header.api_version)
    out = []
    for partition in request.partitions:
        if partition.records is None:
            continue
        for batch in iter_batches(partition.records):
            out.append(
                BatchSeen(
                    partition.topic,
                    partition.partition,
                    batch.crc,
                    batch.crc_valid(),
                    request.acks,
                    batch.producer_id,
                    batch.producer_epoch,
                    batch.base_sequence,
                    batch.records_count,
                    int(batch.compression),
                )
            )
    return out


@dataclass(slots=True)
class RelayedConnection:
    """One connection the relay carried (kipside -> relay -> broker)."""

    number: int
    opened_at: float
    closed_at: float | None = None
    requests: Counter[int] = field(default_factory=Counter)
    """Requests forwarded to the broker on this connection, by API key."""


@dataclass(frozen=True, slots=True)
class RelayCounts:
    """A consistent copy of the relay's counters at one moment."""

    accepted: int
    open: int
    peak_open: int
    requests: Counter[int]
    held_now: int
    cut: int
    swallowed_acks0_responses: int
    acks0_requests: int
    """acks=0 ProduceRequests forwarded to the broker."""
    acks0_answers: int
    """Responses the broker sent to acks=0 ProduceRequests (swallowed or forwarded)."""


class CountingRelay(Relay):
    """A byte-for-byte TCP relay on 127.0.0.1:0 to one broker that counts what passes upstream.

    Usage: `relay = CountingRelay().start()`, then `relay.upstream = (host, port)` before the
    first connection arrives (the broker may need the relay's port before it can start).
    hold(), release(), cut_all(), reset_peak() and problems() come from relaykit.base.Relay.
    """

    def __init__(self, upstream: tuple[str, int] | None = None, *, kafka_acks0: bool = False):
        super().__init__(upstream)
        self.kafka_acks0 = kafka_acks0
        self._swallowed = 0
        self._acks0_requests = 0
        self._acks0_answers = 0
        self._requests: Counter[int] = Counter()
        self._batches: list[BatchSeen] = []
        self._connections: dict[int, RelayedConnection] = {}

    def counts(self) -> RelayCounts:
        with self._lock:
            link = self.link_counts()
            return RelayCounts(
                link.accepted,
                link.open,
                link.peak_open,
                Counter(self._requests),
                link.held_now,
                link.cut,
                self._swallowed,
                self._acks0_requests,
                self._acks0_answers,
            )

    def batches(self) -> list[BatchSeen]:
        """Every record batch forwarded upstream so far, in forwarding order."""
        with self._lock:
            return list(self._batches)

    def connections(self) -> list[RelayedConnection]:
        with self._lock:
            return [
                RelayedConnection(c.number, c.opened_at, c.closed_at, Counter(c.requests))
                for c in self._connections.values()
            ]

    # Hooks (the relay's trio thread) ----------------------------------------------------

    def on_open(self, conn: Conn) -> None:
        with self._lock:
            self._connections[conn.number] = RelayedConnection(conn.number, conn.opened_at)

    def on_close(self, conn: Conn) -> None:
        with self._lock:
            self._connections[conn.number].closed_at = time.monotonic()

    def on_request(self, conn: Conn, request: Request) -> Decision:
        header = request.header
        batches: list[BatchSeen] = []
        acks0 = False
        if header.api_key == ApiKey.PRODUCE:
            try:
                acks0 = produce_acks(request.frame, header) == 0
                batches = produce_batches(request.frame)
            except (ProtocolError, RecordBatchError, ValueError) as exc:
                self.note_problem(f"connection {conn.number}: unreadable ProduceRequest: {exc}")
        with self._lock:
            self._requests[header.api_key] += 1
            self._acks0_requests += acks0
            self._connections[conn.number].requests[header.api_key] += 1
            self._batches.extend(batches)
        return FORWARD

    def on_response(self, conn: Conn, request: Request, frame: bytes) -> bytes | None:
        if request.header.api_key != ApiKey.PRODUCE or produce_acks(request.frame, request.header):
            return frame
        with self._lock:
            self._acks0_answers += 1
            self._swallowed += self.kafka_acks0
        return None if self.kafka_acks0 else frame
