"""A fault-injecting test relay that simulates Apache Kafka's marker-writing window after EndTxn.

Apache Kafka answers EndTxn once PrepareCommit/PrepareAbort is logged, then writes the markers;
until they are written, the coordinator answers the transactional id's next AddPartitionsToTxn and
AddOffsetsToTxn with CONCURRENT_TRANSACTIONS (TransactionCoordinator.scala: PrepareCommit and
PrepareAbort refuse new partitions). Tansu 0.6.0 has no such window. MarkerWindowRelay sits between
kipside and a dedicated Tansu and adds it: for `window_ms` after each successful EndTxn response for
a transactional id, it answers that id's AddPartitionsToTxn (v0-3: every requested partition gets
error 51) and AddOffsetsToTxn (error 51) itself, and forwards everything else unchanged. It is a
SIMULATION of the real broker's behaviour, in front of the real (Tansu) broker.

It is a filter on tests/relaykit's Relay, which is Kafka-frame aware in both directions:
requests are read whole, responses are matched to the requests they answer by correlation id,
and a local answer is queued behind every response still owed on its connection, so each
connection's responses stay in request order (clients and kipside require that). Local answers
are built by kipside's own answer builders (kipside.proxy.stages.transactions), in the
request's API version, header version and correlation id.

Independently of kipside it counts, per transactional id: forwarded ("accepted") and locally
rejected AddPartitionsToTxn / AddOffsetsToTxn, and EndTxn (with the broker's answer), as an
ordered event list so a test can count per transaction (the events between two EndTxns).

A second, optional simulation: Apache Kafka fails a whole AddPartitionsToTxn that names a topic
it doesn't know (UNKNOWN_TOPIC_OR_PARTITION for that topic's partitions, OPERATION_NOT_ATTEMPTED
for the others); Tansu 0.6.0 accepts any topic name there. Topics in `unknown_topics` are
refused that way by the relay (counted as "refused", never forwarded).

`delay_ms` adds a one-way delay to each direction (so a round trip through the relay costs
2 * delay_ms more): a way to give the simulated broker a network RTT. Frames keep their order.

It runs trio in a background thread; the public methods are called from the test's thread.
It binds and dials loopback only. testkit.broker.start_tansu(advertised_port=relay.port) starts
the Tansu to put behind it (the broker must advertise the relay's address, or clients would
bypass it).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import trio
from kio.schema.errors import ErrorCode
from relaykit.base import Relay
from relaykit.decisions import FORWARD, Answer, Conn, Decision, Request

from kipside.protocol.apis import ApiKey
from kipside.protocol.errors import ProtocolError
from kipside.protocol.headers import RequestHeader, parse_response_header
from kipside.protocol.messages import decode_request, decode_response
from kipside.proxy.stages.transactions import add_offsets_answer, add_partitions_answer

CONCURRENT_TRANSACTIONS: Final = int(ErrorCode.concurrent_transactions)  # 51
MAX_V3_ADD_PARTITIONS: Final = 3  # v4+ is the broker-to-broker batch form: forwarded as is

UNKNOWN_TOPIC_OR_PARTITION: Final = int(ErrorCode.unknown_topic_or_partition)  # 3
OPERATION_NOT_ATTEMPTED: Final = int(ErrorCode.operation_not_attempted)  # 55

ADD_PARTITIONS: Final = "AddPartitionsToTxn"
ADD_OFFSETS: Final = "AddOffsetsToTxn"
END_TXN: Final = "EndTxn"
ACCEPTED: Final = "accepted"  # forwarded to the broker
REJECTED: Final = "rejected"  # answered CONCURRENT_TRANSACTIONS by the relay (in a window)
REFUSED: Final = "refused"  # answered UNKNOWN_TOPIC_OR_PARTITION by the relay (unknown_topics)
_KINDS: Final[dict[int, str]] = {
    ApiKey.ADD_PARTITIONS_TO_TXN: ADD_PARTITIONS,
    ApiKey.ADD_OFFSETS_TO_TXN: ADD_OFFSETS,
    ApiKey.END_TXN: END_TXN,
}


@dataclass(frozen=True, slots=True)
class TxnEvent:
    """One transactional request that passed (or was stopped by) the relay."""

    at: float  # time.monotonic()
    kind: str  # ADD_PARTITIONS, ADD_OFFSETS or END_TXN
    outcome: str  # ACCEPTED, REJECTED or REFUSED (END_TXN: always ACCEPTED)
    error_code: int | None = None  # END_TXN: the broker's answer; else the relay's, or None
    committed: bool | None = None  # END_TXN: commit or abort
    partitions: tuple[tuple[str, int], ...] = ()  # ADD_PARTITIONS: what was asked for
    group: str | None = None  # ADD_OFFSETS


# The counted adds, each by the (kind, outcome) of the events it counts.
_ADD_COUNTS: Final = {
    "accepted_add_partitions": (ADD_PARTITIONS, ACCEPTED),
    "rejected_add_partitions": (ADD_PARTITIONS, REJECTED),
    "refused_add_partitions": (ADD_PARTITIONS, REFUSED),
    "accepted_add_offsets": (ADD_OFFSETS, ACCEPTED),
    "rejected_add_offsets": (ADD_OFFSETS, REJECTED),
}


@dataclass(frozen=True, slots=True)
class AddCounts:
    """How many AddPartitionsToTxn / AddOffsetsToTxn requests went which way (_ADD_COUNTS)."""

    accepted_add_partitions: int
    rejected_add_partitions: int
    refused_add_partitions: int
    accepted_add_offsets: int
    rejected_add_offsets: int


def _add_counts(kinds: Counter[tuple[str, str]]) -> dict[str, Any]:
    return {name: kinds[kind] for name, kind in _ADD_COUNTS.items()}


@dataclass(frozen=True, slots=True)
class TxnSegment(AddCounts):
    """What the relay saw for one transaction of one id: the events up to its EndTxn."""

    end: TxnEvent | None  # None: the transaction had not ended (yet)


@dataclass(frozen=True, slots=True)
class TxnCounts(AddCounts):
    """A consistent copy of the relay's counters (all transactional ids together)."""

    end_txn: int
    end_txn_ok: int
    forwarded: Counter[int]  # every forwarded request, by API key
    local_answers: int
    connections: int


class MarkerWindowRelay(Relay):
    """Relay on 127.0.0.1:0 to one broker, answering CONCURRENT_TRANSACTIONS in the window.

    Usage: `relay = MarkerWindowRelay(window_ms=50).start()`, start the broker advertising
    `relay.port`, then set `relay.upstream = (host, broker_port)` before the first connection.
    `window_ms`, `delay_ms` and `unknown_topics` may be changed while traffic flows.
    """

    def __init__(
        self,
        upstream: tuple[str, int] | None = None,
        *,
        window_ms: float = 50.0,
        delay_ms: float = 0.0,
        unknown_topics: Iterable[str] = (),
    ) -> None:
        super().__init__(upstream)
        self.window_ms = window_ms
        self.delay_ms = delay_ms
        self.unknown_topics = frozenset(unknown_topics)
        self._events: dict[str, list[TxnEvent]] = {}
        self._window_until: dict[str, float] = {}  # trio clock
        self._forwarded: Counter[int] = Counter()
        self._local_answers = 0

    @property
    def delay_ms(self) -> float:
        """The one-way delay of each direction (a simulated network RTT of 2 * delay_ms)."""
        return self.request_delay_ms

    @delay_ms.setter
    def delay_ms(self, value: float) -> None:
        self.request_delay_ms = self.response_delay_ms = value

    # Control (test thread) --------------------------------------------------------------

    def events(self, transactional_id: str) -> list[TxnEvent]:
        with self._lock:
            return list(self._events.get(transactional_id, ()))

    def transactional_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._events)

    def segments(self, transactional_id: str) -> list[TxnSegment]:
        """Per transaction (events split after each EndTxn the broker answered without error):
        the accepted and rejected adds, and the EndTxn that ended it."""
        out: list[TxnSegment] = []
        counts: Counter[tuple[str, str]] = Counter()
        for event in self.events(transactional_id):
            if event.kind != END_TXN:
                counts[event.kind, event.outcome] += 1
                continue
            if event.error_code != 0:
                continue  # the transaction did not end
            out.append(_segment(counts, event))
            counts = Counter()
        if counts:
            out.append(_segment(counts, None))
        return out

    def counts(self) -> TxnCounts:
        with self._lock:
            every = [e for events in self._events.values() for e in events]
            kinds = Counter((e.kind, e.outcome) for e in every)
            return TxnCounts(
                **_add_counts(kinds),
                end_txn=kinds[END_TXN, ACCEPTED],
                end_txn_ok=sum(1 for e in every if e.kind == END_TXN and e.error_code == 0),
                forwarded=Counter(self._forwarded),
                local_answers=self._local_answers,
                connections=self.link_counts().accepted,
            )

    def open_window(self, transactional_id: str, window_ms: float) -> None:
        """Start a window for an id now, as if an EndTxn had just been answered."""

        def start() -> None:
            self._window_until[transactional_id] = trio.current_time() + window_ms / 1000

        self._call(start)

    # Hooks (the relay's trio thread) ----------------------------------------------------

    def on_request(self, conn: Conn, request: Request) -> Decision:
        answer = self._local_answer(conn, request.header, request.frame)
        with self._lock:
            if answer is None:
                self._forwarded[request.header.api_key] += 1
            else:
                self._local_answers += 1
        return FORWARD if answer is None else Answer(answer)

    def on_response(self, conn: Conn, request: Request, frame: bytes) -> bytes | None:
        if request.header.api_key == ApiKey.END_TXN:
            self._end_txn(conn, request, frame)
        return frame

    def _local_answer(self, conn: Conn, header: RequestHeader, frame: bytes) -> bytes | None:
        """Classify a request; return the relay's own answer if it is in a window, else None."""
        kind = _KINDS.get(header.api_key)
        if kind is None or kind == END_TXN:
            return None
        if kind == ADD_PARTITIONS and header.api_version > MAX_V3_ADD_PARTITIONS:
            return None
        try:
            request = decode_request(header.api_key, header.api_version, frame, header.body_offset)
        except ProtocolError as exc:
            self.note_problem(f"connection {conn.number}: unreadable {kind} request: {exc}")
            return None
        if kind == ADD_PARTITIONS:
            txn_id = str(request.v3_and_below_transactional_id)
            partitions = tuple(
                (str(t.name), int(p)) for t in request.v3_and_below_topics for p in t.partitions
            )
            group = None
        else:
            txn_id = str(request.transactional_id)
            partitions = ()
            group = str(request.group_id)
        unknown = {t for t, _ in partitions} & self.unknown_topics
        if unknown:
            # Apache Kafka checks the topics before the coordinator sees the request.
            outcome, code = REFUSED, UNKNOWN_TOPIC_OR_PARTITION
            answer = _add_partitions_answer(
                header,
                request,
                lambda topic: (
                    UNKNOWN_TOPIC_OR_PARTITION if topic in unknown else OPERATION_NOT_ATTEMPTED
                ),
            )
        elif trio.current_time() < self._window_until.get(txn_id, -math.inf):
            outcome, code = REJECTED, CONCURRENT_TRANSACTIONS
            if kind == ADD_PARTITIONS:
                answer = _add_partitions_answer(header, request, lambda _: CONCURRENT_TRANSACTIONS)
            else:
                answer = add_offsets_answer(header, CONCURRENT_TRANSACTIONS)
        else:
            outcome, code, answer = ACCEPTED, None, None
        self._record(
            txn_id,
            TxnEvent(time.monotonic(), kind, outcome, code, partitions=partitions, group=group),
        )
        return answer

    def _end_txn(self, conn: Conn, request: Request, frame: bytes) -> None:
        key, version = request.header.api_key, request.header.api_version
        try:
            sent = decode_request(key, version, request.frame, request.header.body_offset)
            header = parse_response_header(frame, key, version)
            code = int(decode_response(key, version, frame, header.body_offset).error_code)
        except ProtocolError as exc:
            self.note_problem(f"connection {conn.number}: unreadable EndTxn: {exc}")
            return
        txn_id = str(sent.transactional_id)
        if code == 0:
            # The coordinator now "writes markers" for window_ms.
            self._window_until[txn_id] = trio.current_time() + self.window_ms / 1000
        self._record(
            txn_id,
            TxnEvent(
                time.monotonic(), END_TXN, ACCEPTED, error_code=code, committed=bool(sent.committed)
            ),
        )

    def _record(self, txn_id: str, event: TxnEvent) -> None:
        with self._lock:
            self._events.setdefault(txn_id, []).append(event)


def _segment(counts: Counter[tuple[str, str]], end: TxnEvent | None) -> TxnSegment:
    return TxnSegment(**_add_counts(counts), end=end)


# --------------------------------------------------------------------------- local answers


def _add_partitions_answer(
    header: RequestHeader, request: Any, error_for: Callable[[str], int]
) -> bytes:
    """AddPartitionsToTxn v0-3, built by kipside's own code: every requested partition, in
    request order, with error_for(topic)."""
    errors = {
        (str(topic.name), int(p)): error_for(str(topic.name))
        for topic in request.v3_and_below_topics
        for p in topic.partitions
    }
    return add_partitions_answer(header, request, errors)
