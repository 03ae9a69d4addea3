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

Two more simulations of Apache Kafka, off by default (Tansu 0.6.0 has neither):

- `describe_transactions=True` models a 3.0+ coordinator (KIP-664): the relay advertises
  DescribeTransactions v0 in every ApiVersions answer and answers it itself from what it saw of
  each transactional id: Empty after InitProducerId, Ongoing once an add was accepted,
  PrepareCommit/PrepareAbort during the window after EndTxn (listing the partitions whose
  markers are not yet written, fewer as the window passes), then CompleteCommit/CompleteAbort.
  Without it the relay advertises nothing Tansu does not (Tansu does not offer the API), so a
  client sees the broker as it is. `describe_error` (an error code) makes it answer every
  DescribeTransactions with that error instead, as a coordinator does to a principal without
  Describe permission on the transactional id.
- `init_producer_id_v0=True`: Apache Kafka answers InitProducerId v0-1 as it does later
  versions; Tansu 0.6.0 answers them UNKNOWN_SERVER_ERROR (tests/integration/tansu_bugs.py),
  and aiokafka sends only v0. The relay asks Tansu in v3 and answers in the client's version.

`delay_ms` adds a one-way delay to each direction (so a round trip through the relay costs
2 * delay_ms more): a way to give the simulated broker a network RTT. Frames keep their order.

It runs trio in a background thread; the public methods are called from the test's thread.
It binds and dials loopback only. testkit.broker.start_tansu(advertised_port=relay.port) starts
the Tansu to put behind it (the broker must advertise the relay's address, or clients would
bypass it).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import trio
from kio.schema.errors import ErrorCode
from relaykit.base import Relay, response_frame
from relaykit.decisions import FORWARD, Answer, Conn, Decision, Forward, Request

from kipside.protocol import blank, field_entity
from kipside.protocol.apis import ApiKey
from kipside.protocol.errors import ProtocolError
from kipside.protocol.headers import (
    RequestHeader,
    build_frame,
    encode_request_header,
    parse_response_header,
)
from kipside.protocol.messages import (
    decode_request,
    decode_response,
    encode_message,
    request_class,
    response_class,
)
from kipside.proxy.stages.transactions import add_offsets_answer, add_partitions_answer

CONCURRENT_TRANSACTIONS: Final = int(ErrorCode.concurrent_transactions)  # 51
MAX_V3_ADD_PARTITIONS: Final = 3  # v4+ is the broker-to-broker batch form: forwarded as is

UNKNOWN_TOPIC_OR_PARTITION: Final = int(ErrorCode.unknown_topic_or_partition)  # 3
OPERATION_NOT_ATTEMPTED: Final = int(ErrorCode.operation_not_attempted)  # 55

ADD_PARTITIONS: Final = "AddPartitionsToTxn"
ADD_OFFSETS: Final = "AddOffsetsToTxn"
END_TXN: Final = "EndTxn"
DESCRIBE: Final = "DescribeTransactions"  # answered by the relay (describe_transactions=True)
TRANSACTIONAL_ID_NOT_FOUND: Final = int(ErrorCode.transactional_id_not_found)
INIT_PRODUCER_ID_ASKED: Final = 3  # the version the relay asks Tansu in (init_producer_id_v0)
_ZERO = datetime.timedelta(0)
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
    kind: str  # ADD_PARTITIONS, ADD_OFFSETS, END_TXN or DESCRIBE
    outcome: str  # ACCEPTED, REJECTED or REFUSED (END_TXN, DESCRIBE: always ACCEPTED)
    error_code: int | None = None  # END_TXN: the broker's answer; else the relay's, or None
    committed: bool | None = None  # END_TXN: commit or abort
    partitions: tuple[tuple[str, int], ...] = ()  # ADD_PARTITIONS: what was asked for
    group: str | None = None  # ADD_OFFSETS
    state: str | None = None  # DESCRIBE: the state the relay answered


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
    described: int = 0  # DescribeTransactions of the id


@dataclass(frozen=True, slots=True)
class TxnCounts(AddCounts):
    """A consistent copy of the relay's counters (all transactional ids together)."""

    end_txn: int
    end_txn_ok: int
    forwarded: Counter[int]  # every forwarded request, by API key
    local_answers: int
    connections: int
    described: int = 0  # DescribeTransactions the relay answered


@dataclass(slots=True)
class _Coordinated:
    """One transactional id as the simulated coordinator sees it."""

    state: str = "Empty"
    producer_id: int = -1
    producer_epoch: int = -1
    partitions: list[tuple[str, int]] = field(default_factory=list)
    prepared_at: float = 0.0  # trio clock: when the window began
    window_until: float = -math.inf

    def at(self, now: float) -> tuple[str, list[tuple[str, int]]]:
        """The state and the partitions a DescribeTransactions at `now` reports: while the
        markers are written, those still lacking theirs (written in order, evenly over the
        window)."""
        if not self.state.startswith("Prepare"):
            return self.state, self.partitions
        if now >= self.window_until:
            self.state = "Complete" + self.state.removeprefix("Prepare")
            self.partitions = []
            return self.state, []
        span = self.window_until - self.prepared_at
        written = int(len(self.partitions) * (now - self.prepared_at) / span) if span else 0
        return self.state, self.partitions[written:]


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
        describe_transactions: bool = False,
        init_producer_id_v0: bool = False,
    ) -> None:
        super().__init__(upstream)
        self.window_ms = window_ms
        self.delay_ms = delay_ms
        self.unknown_topics = frozenset(unknown_topics)
        self.describe_transactions = describe_transactions
        self.describe_error: int | None = None
        self.init_producer_id_v0 = init_producer_id_v0
        self._events: dict[str, list[TxnEvent]] = {}
        self._coordinated: dict[str, _Coordinated] = {}
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
                described=kinds[DESCRIBE, ACCEPTED],
            )

    def open_window(self, transactional_id: str, window_ms: float) -> None:
        """Start a window for an id now, as if an EndTxn had just been answered."""

        def start() -> None:
            self._prepare(transactional_id, True, window_ms)

        self._call(start)

    # Hooks (the relay's trio thread) ----------------------------------------------------

    def on_request(self, conn: Conn, request: Request) -> Decision:
        header = request.header
        if header.api_key == ApiKey.DESCRIBE_TRANSACTIONS and self.describe_transactions:
            answer: bytes | None = self._describe(conn, request)
        elif header.api_key == ApiKey.INIT_PRODUCER_ID and self._asks_v3(header):
            with self._lock:
                self._forwarded[header.api_key] += 1
            return Forward(_init_producer_id_v3(request))
        else:
            answer = self._local_answer(conn, request)
        with self._lock:
            if answer is None:
                self._forwarded[header.api_key] += 1
            else:
                self._local_answers += 1
        return FORWARD if answer is None else Answer(answer)

    def on_response(self, conn: Conn, request: Request, frame: bytes) -> bytes | None:
        key, version = request.header.api_key, request.header.api_version
        if key == ApiKey.INIT_PRODUCER_ID and self._asks_v3(request.header):
            frame = _init_producer_id_answer(request.header, frame)
        try:
            if key == ApiKey.END_TXN:
                self._end_txn(request, frame)
            elif key == ApiKey.API_VERSIONS and self.describe_transactions:
                frame = _offering_describe_transactions(request.header, frame)
            elif key in (ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN) or (
                key == ApiKey.ADD_OFFSETS_TO_TXN
            ):
                self._coordinator_learns(request, frame)
        except ProtocolError as exc:
            self.note_problem(f"connection {conn.number}: unreadable {key} v{version}: {exc}")
        return frame

    def _asks_v3(self, header: RequestHeader) -> bool:
        return self.init_producer_id_v0 and header.api_version < INIT_PRODUCER_ID_ASKED

    def _state(self, txn_id: str) -> _Coordinated:
        return self._coordinated.setdefault(txn_id, _Coordinated())

    def _prepare(self, txn_id: str, committed: bool, window_ms: float) -> None:
        coordinated = self._state(txn_id)
        coordinated.state = "PrepareCommit" if committed else "PrepareAbort"
        coordinated.prepared_at = trio.current_time()
        coordinated.window_until = coordinated.prepared_at + window_ms / 1000

    def _coordinator_learns(self, request: Request, frame: bytes) -> None:
        """What the simulated coordinator learns from Tansu's answers: the producer of
        InitProducerId, the partitions of accepted adds (the transaction is then Ongoing)."""
        header = request.header
        key, version = header.api_key, header.api_version
        if key == ApiKey.ADD_PARTITIONS_TO_TXN and version > MAX_V3_ADD_PARTITIONS:
            return
        sent = decode_request(key, version, request.frame, header.body_offset)
        answer = decode_response(
            key, version, frame, parse_response_header(frame, key, version).body_offset
        )
        if key == ApiKey.INIT_PRODUCER_ID:
            if sent.transactional_id is not None and answer.error_code == 0:
                coordinated = self._state(str(sent.transactional_id))
                coordinated.state, coordinated.partitions = "Empty", []
                coordinated.producer_id = int(answer.producer_id)
                coordinated.producer_epoch = int(answer.producer_epoch)
            return
        if key == ApiKey.ADD_PARTITIONS_TO_TXN:
            txn_id = str(sent.v3_and_below_transactional_id)
            added = [
                (str(t.name), int(p.partition_index))
                for t in answer.results_by_topic_v3_and_below
                for p in t.results_by_partition
                if p.partition_error_code == 0
            ]
        else:
            txn_id, added = str(sent.transactional_id), []
            if answer.error_code != 0:
                return
        coordinated = self._state(txn_id)
        coordinated.at(trio.current_time())  # a window that is over has completed
        if not coordinated.state.startswith("Prepare") and (
            added or key != ApiKey.ADD_PARTITIONS_TO_TXN
        ):
            if coordinated.state != "Ongoing":
                coordinated.state, coordinated.partitions = "Ongoing", []
            coordinated.partitions += [tp for tp in added if tp not in coordinated.partitions]

    def _describe(self, conn: Conn, request: Request) -> bytes:
        """The simulated coordinator's answer to DescribeTransactions."""
        header = request.header
        sent = decode_request(header.api_key, header.api_version, request.frame, header.body_offset)
        cls = response_class(header.api_key, header.api_version)
        state_cls = field_entity(cls, "transaction_states")
        topic_cls = field_entity(state_cls, "topics")
        now = request.due
        states = []
        for txn_id in sent.transactional_ids:
            coordinated = self._coordinated.get(str(txn_id))
            if coordinated is None or self.describe_error is not None:
                error = TRANSACTIONAL_ID_NOT_FOUND if coordinated is None else self.describe_error
                self._record(str(txn_id), TxnEvent(_monotonic(now), DESCRIBE, ACCEPTED, error))
                states.append(
                    blank(
                        state_cls,
                        error_code=error,
                        transactional_id=txn_id,
                        transaction_state="",
                        transaction_timeout=_ZERO,
                        transaction_start_time=datetime.datetime.fromtimestamp(0, datetime.UTC),
                        producer_id=-1,
                        producer_epoch=-1,
                        topics=(),
                    )
                )
                continue
            state, partitions = coordinated.at(now)
            by_topic: dict[str, list[int]] = {}
            for topic, partition in partitions:
                by_topic.setdefault(topic, []).append(partition)
            states.append(
                blank(
                    state_cls,
                    error_code=0,
                    transactional_id=txn_id,
                    transaction_state=state,
                    transaction_timeout=datetime.timedelta(seconds=60),
                    transaction_start_time=datetime.datetime.now(datetime.UTC),
                    producer_id=coordinated.producer_id,
                    producer_epoch=coordinated.producer_epoch,
                    topics=tuple(
                        blank(topic_cls, topic=t, partitions=tuple(ps))
                        for t, ps in by_topic.items()
                    ),
                )
            )
            self._record(str(txn_id), TxnEvent(_monotonic(now), DESCRIBE, ACCEPTED, 0, state=state))
        message = blank(cls, throttle_time=_ZERO, transaction_states=tuple(states))
        return response_frame(header, encode_message(message))

    def _local_answer(self, conn: Conn, request: Request) -> bytes | None:
        """Classify a request; return the relay's own answer if it reached the simulated
        coordinator in a window, else None."""
        header, frame, due = request.header, request.frame, request.due
        kind = _KINDS.get(header.api_key)
        if kind is None or kind == END_TXN:
            return None
        if kind == ADD_PARTITIONS and header.api_version > MAX_V3_ADD_PARTITIONS:
            return None
        try:
            sent = decode_request(header.api_key, header.api_version, frame, header.body_offset)
        except ProtocolError as exc:
            self.note_problem(f"connection {conn.number}: unreadable {kind} request: {exc}")
            return None
        if kind == ADD_PARTITIONS:
            txn_id = str(sent.v3_and_below_transactional_id)
            partitions = tuple(
                (str(t.name), int(p)) for t in sent.v3_and_below_topics for p in t.partitions
            )
            group = None
        else:
            txn_id = str(sent.transactional_id)
            partitions = ()
            group = str(sent.group_id)
        unknown = {t for t, _ in partitions} & self.unknown_topics
        if unknown:
            # Apache Kafka checks the topics before the coordinator sees the request.
            outcome, code = REFUSED, UNKNOWN_TOPIC_OR_PARTITION
            answer = _add_partitions_answer(
                header,
                sent,
                lambda topic: (
                    UNKNOWN_TOPIC_OR_PARTITION if topic in unknown else OPERATION_NOT_ATTEMPTED
                ),
            )
        elif due < self._state(txn_id).window_until:
            outcome, code = REJECTED, CONCURRENT_TRANSACTIONS
            if kind == ADD_PARTITIONS:
                answer = _add_partitions_answer(header, sent, lambda _: CONCURRENT_TRANSACTIONS)
            else:
                answer = add_offsets_answer(header, CONCURRENT_TRANSACTIONS)
        else:
            outcome, code, answer = ACCEPTED, None, None
        self._record(
            txn_id,
            TxnEvent(_monotonic(due), kind, outcome, code, partitions=partitions, group=group),
        )
        return answer

    def _end_txn(self, request: Request, frame: bytes) -> None:
        key, version = request.header.api_key, request.header.api_version
        sent = decode_request(key, version, request.frame, request.header.body_offset)
        header = parse_response_header(frame, key, version)
        code = int(decode_response(key, version, frame, header.body_offset).error_code)
        txn_id = str(sent.transactional_id)
        if code == 0:
            # The coordinator now "writes markers" for window_ms.
            self._prepare(txn_id, bool(sent.committed), self.window_ms)
        self._record(
            txn_id,
            TxnEvent(
                time.monotonic(), END_TXN, ACCEPTED, error_code=code, committed=bool(sent.committed)
            ),
        )

    def _record(self, txn_id: str, event: TxnEvent) -> None:
        with self._lock:
            self._events.setdefault(txn_id, []).append(event)


def _monotonic(at: float) -> float:
    """A trio clock time of the relay's thread on time.monotonic()'s scale (TxnEvent.at)."""
    return time.monotonic() - (trio.current_time() - at)


def _segment(counts: Counter[tuple[str, str]], end: TxnEvent | None) -> TxnSegment:
    return TxnSegment(**_add_counts(counts), end=end, described=counts[DESCRIBE, ACCEPTED])


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


# --------------------------------------------------------------------------- Apache Kafka's answers


def _offering_describe_transactions(request: RequestHeader, frame: bytes) -> bytes:
    """An ApiVersions answer that also offers DescribeTransactions v0, as Apache Kafka 3.0+'s
    does."""
    key, version = request.api_key, request.api_version
    answer = decode_response(
        key, version, frame, parse_response_header(frame, key, version).body_offset
    )
    if answer.error_code != 0 or any(
        e.api_key == ApiKey.DESCRIBE_TRANSACTIONS for e in answer.api_keys
    ):
        return frame
    entry_cls = field_entity(type(answer), "api_keys")
    offered = blank(entry_cls, api_key=ApiKey.DESCRIBE_TRANSACTIONS, min_version=0, max_version=0)
    keys = tuple(sorted((*answer.api_keys, offered), key=lambda e: int(e.api_key)))
    return response_frame(request, encode_message(dataclasses.replace(answer, api_keys=keys)))


def _init_producer_id_v3(request: Request) -> bytes:
    """The client's InitProducerId v0-1 asked again in v3 (no producer id or epoch yet)."""
    header = request.header
    sent = decode_request(header.api_key, header.api_version, request.frame, header.body_offset)
    asked = request_class(ApiKey.INIT_PRODUCER_ID, INIT_PRODUCER_ID_ASKED)(
        transactional_id=sent.transactional_id,
        transaction_timeout=sent.transaction_timeout,
        producer_id=-1,
        producer_epoch=-1,
    )
    head = encode_request_header(
        ApiKey.INIT_PRODUCER_ID, INIT_PRODUCER_ID_ASKED, header.correlation_id, header.client_id
    )
    return build_frame(head, encode_message(asked))


def _init_producer_id_answer(request: RequestHeader, frame: bytes) -> bytes:
    """Tansu's v3 answer to _init_producer_id_v3, in the client's version."""
    key = ApiKey.INIT_PRODUCER_ID
    head = parse_response_header(frame, key, INIT_PRODUCER_ID_ASKED)
    answer = decode_response(key, INIT_PRODUCER_ID_ASKED, frame, head.body_offset)
    told = response_class(key, request.api_version)(
        throttle_time=answer.throttle_time,
        error_code=answer.error_code,
        producer_id=answer.producer_id,
        producer_epoch=answer.producer_epoch,
    )
    return response_frame(request, encode_message(told))
