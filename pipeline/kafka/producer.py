"""Produce existing record batches as one idempotent producer, never re-encoding them.

The shallow mirror hands over batches it read; each is re-stamped with this producer's id,
epoch and the partition's next sequence (protocol.records.restamp: header rewritten, CRC
recomputed, records untouched) and sent in multi-partition ProduceRequests, one batch per
partition per request (Kafka's rule for v3+), up to five requests in flight per broker as an
idempotent producer may have. Retriable errors (a moved leader, a timeout, a dropped
connection) are retried the idempotent way: everything in flight is drained, the failed
batches go back to the front of their partition's queue with their sequences unchanged, and
the broker drops any duplicate. What it must never do: reorder a partition, give a batch a new
sequence, or report a batch written that the broker did not acknowledge.

With a transactional id it is the producing half of a transactional producer
(pipeline.kafka.transaction runs the transactions): its session comes from the transaction
coordinator, batches carry the transactional bit and requests the id, and each partition is
registered with the transaction (`register`) before its first batch is sent. A producer that a
newer one with the same id fenced gets FencedError.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Final, Generic, TypeVar

from kipside.protocol import (
    PRODUCE_MAX_VERSION,
    PRODUCE_MIN_VERSION,
    ApiKey,
    ErrorCode,
    PartitionBatch,
    RecordBatchView,
    VersionRange,
    encode_produce_request,
    error_name,
    is_retriable,
    parse_produce_response,
    restamp,
)

from .client import DedicatedConnection, KafkaClient, body_of, check_error
from .connection import BrokerConnection, ConnectionFailed
from .errors import BrokerError, FencedError, KafkaError, RetriableError

__all__ = ["FENCED", "IdempotentProducer", "ProduceConfig", "Written"]

Tag = TypeVar("Tag")
TopicPartition = tuple[str, int]
PRODUCE: Final = VersionRange(PRODUCE_MIN_VERSION, PRODUCE_MAX_VERSION)
INIT_PRODUCER_ID: Final = VersionRange(0, 5)
_DUPLICATE: Final = int(ErrorCode.duplicate_sequence_number)
_OUT_OF_ORDER: Final = int(ErrorCode.out_of_order_sequence_number)
_ACKS_ALL: Final = -1
_MAX_SEQUENCE: Final = 2**31 - 1
FENCED: Final = frozenset(
    {
        int(ErrorCode.producer_fenced),
        int(ErrorCode.invalid_producer_epoch),
        int(ErrorCode.transactional_id_authorization_failed),
        int(ErrorCode.invalid_txn_state),
    }
)
"""Answers that end a transactional producer's session: a newer writer took over, or the
transaction is no longer this producer's."""
_TRANSACTION_COORDINATOR: Final = 1


@dataclass(frozen=True, slots=True)
class ProduceConfig:
    """Producer settings, named after the Kafka producer configs they stand for."""

    max_request_size: int = 16 * 1024 * 1024
    """max.request.size: bytes of batches in one ProduceRequest (one batch always fits)."""
    max_in_flight: int = 5
    """max.in.flight.requests.per.connection (at most 5 for an idempotent producer)."""
    request_timeout_ms: int = 30_000
    """request.timeout.ms: also the broker-side timeout of each ProduceRequest."""
    delivery_timeout_ms: int = 120_000
    """delivery.timeout.ms: how long a batch may go unacknowledged through retries."""


@dataclass(frozen=True, slots=True)
class Written(Generic[Tag]):
    """A batch the destination acknowledged, at `base_offset` (-1: a duplicate whose first
    write's offset the broker did not repeat)."""

    topic: str
    partition: int
    base_offset: int
    tag: Tag


@dataclass(slots=True)
class _Outgoing(Generic[Tag]):
    topic: str
    partition: int
    header: bytes
    body: memoryview
    sequence: int
    size: int
    tag: Tag
    order: int
    """Queue order, to put failed batches back where they were (sequences wrap)."""


@dataclass(slots=True)
class _Request(Generic[Tag]):
    leader: int
    conn: BrokerConnection
    batches: list[_Outgoing[Tag]]
    version: int


@dataclass(slots=True)
class _Session:
    producer_id: int
    producer_epoch: int
    next_sequence: dict[TopicPartition, int] = field(default_factory=dict)


class IdempotentProducer(Generic[Tag]):
    """One idempotent producer session on one cluster. Not thread-safe."""

    def __init__(
        self,
        client: KafkaClient,
        config: ProduceConfig | None = None,
        *,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
        register: Callable[[list[TopicPartition]], None] | None = None,
        connections: dict[int, DedicatedConnection] | None = None,
    ) -> None:
        self.client = client
        self.config = config or ProduceConfig()
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self._register = register
        self._session: _Session | None = None
        self._queues: dict[TopicPartition, deque[_Outgoing[Tag]]] = {}
        self._queued_bytes = 0
        self._order = count()
        # Produce requests stay in flight, so they get connections of their own (a caller
        # running one producer after another may hand them the same ones).
        self._connections: dict[int, DedicatedConnection] = (
            {} if connections is None else connections
        )
        self._owns_connections = connections is None

    @property
    def producer_id(self) -> int:
        return self._ensure_session().producer_id

    @property
    def producer_epoch(self) -> int:
        return self._ensure_session().producer_epoch

    def new_session(self) -> None:
        """Ask for the session again (a transactional producer: the coordinator bumps the
        epoch, fencing any older writer of the id and aborting what it left open)."""
        self._session = None
        self._queues.clear()
        self._queued_bytes = 0
        self._ensure_session()

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    def reset(self) -> None:
        """Forget the session (after a failure): the next batch starts a new one."""
        self.close()
        self._session = None
        self._queues.clear()
        self._queued_bytes = 0

    def add(self, topic: str, partition: int, batch: RecordBatchView, tag: Tag) -> None:
        """Queue `batch` for topic-partition under this session's next sequence."""
        session = self._ensure_session()
        tp = (topic, partition)
        sequence = session.next_sequence.get(tp, 0)
        header, body = restamp(
            batch,
            session.producer_id,
            session.producer_epoch,
            sequence,
            transactional=self.transactional_id is not None,
        )
        count = batch.records_count
        session.next_sequence[tp] = (sequence + count) % (_MAX_SEQUENCE + 1)
        outgoing = _Outgoing(
            topic, partition, header, body, sequence, batch.size, tag, next(self._order)
        )
        self._queues.setdefault(tp, deque()).append(outgoing)
        self._queued_bytes += batch.size

    def flush(self, on_written: Callable[[list[Written[Tag]]], None]) -> None:
        """Send everything queued; `on_written` gets each acknowledged group as it lands."""
        last_progress = time.monotonic()
        last_error: KafkaError | None = None
        backoff = self.client.config.retry.backoff_ms / 1000
        while self._queues:
            try:
                written = self._send_round()
            except RetriableError as exc:
                last_error = exc
                waited = time.monotonic() - last_progress
                if waited > self.config.delivery_timeout_ms / 1000:
                    raise KafkaError(
                        f"producing to {self.client.where}: no batch acknowledged for "
                        f"{waited:.0f} s (delivery.timeout.ms {self.config.delivery_timeout_ms}); "
                        f"last error: {last_error}"
                    ) from exc
                self.client.invalidate_metadata()
                time.sleep(backoff)
                backoff = min(backoff * 2, self.client.config.retry.backoff_max_ms / 1000)
                continue
            if written:
                last_progress = time.monotonic()
                backoff = self.client.config.retry.backoff_ms / 1000
                on_written(written)

    # Session ---------------------------------------------------------------------------------

    def _ensure_session(self) -> _Session:
        if self._session is None:
            self._session = self.client.retrying("InitProducerId", self._init_producer_id)
        return self._session

    def _init_producer_id(self) -> _Session:
        # -1/-1 asks for a producer id: a new one (idempotent), or the transactional id's with
        # its epoch bumped (transactional).
        fields = {
            "transactional_id": self.transactional_id,
            "transaction_timeout": self.transaction_timeout_ms,
            "producer_id": -1,
            "producer_epoch": -1,
        }
        body = body_of(ApiKey.INIT_PRODUCER_ID, fields)
        node = None
        if self.transactional_id is not None:
            node = self.client.coordinator(self.transactional_id, _TRANSACTION_COORDINATOR)
        response = self.client.request(
            node, ApiKey.INIT_PRODUCER_ID, INIT_PRODUCER_ID, body
        ).decode()
        what = "InitProducerId" + (
            f" for transactional id {self.transactional_id!r}" if self.transactional_id else ""
        )
        check_error(int(response.error_code), what, self.client.where)
        return _Session(int(response.producer_id), int(response.producer_epoch))

    # Sending -------------------------------------------------------------------------------

    def _send_round(self) -> list[Written[Tag]]:
        """Send requests (up to max_in_flight per leader) until the queues drain or a request
        fails; collect every answer before returning, so nothing is left in flight."""
        in_flight: deque[_Request[Tag]] = deque()
        written: list[Written[Tag]] = []
        failed: list[_Outgoing[Tag]] = []
        error: RetriableError | None = None
        try:
            while True:
                if error is None:
                    try:
                        self._fill(in_flight)
                    except RetriableError as exc:
                        error = exc
                if not in_flight:
                    break
                request = in_flight.popleft()
                try:
                    error = self._receive(request, written, failed) or error
                except RetriableError as exc:
                    error = exc
                    failed.extend(request.batches)
        except BaseException:
            for request in in_flight:
                request.conn.close()
            raise
        finally:
            self._requeue(failed)
        if error is not None and not written:
            raise error
        return written

    def _fill(self, in_flight: deque[_Request[Tag]]) -> None:
        if self._register is not None:
            self._register(list(self._queues))
        per_leader: dict[int, int] = {}
        for request in in_flight:
            per_leader[request.leader] = per_leader.get(request.leader, 0) + 1
        for leader, tps in self._by_leader().items():
            while per_leader.get(leader, 0) < self.config.max_in_flight:
                batches = self._take(tps)
                if not batches:
                    break
                try:
                    request = self._send(leader, batches)
                except RetriableError:
                    self._requeue(batches)
                    raise
                in_flight.append(request)
                per_leader[leader] = per_leader.get(leader, 0) + 1

    def _by_leader(self) -> dict[int, list[TopicPartition]]:
        groups: dict[int, list[TopicPartition]] = {}
        for tp in self._queues:
            groups.setdefault(self.client.leader(*tp), []).append(tp)
        return groups

    def _take(self, tps: list[TopicPartition]) -> list[_Outgoing[Tag]]:
        """One batch from the head of each partition's queue, up to max.request.size."""
        taken: list[_Outgoing[Tag]] = []
        size = 0
        for tp in tps:
            queue = self._queues.get(tp)
            if not queue:
                continue
            head = queue[0]
            if taken and size + head.size > self.config.max_request_size:
                break
            queue.popleft()
            if not queue:
                del self._queues[tp]
            taken.append(head)
            size += head.size
            self._queued_bytes -= head.size
        return taken

    def _connection(self, leader: int) -> DedicatedConnection:
        dedicated = self._connections.get(leader)
        if dedicated is None or dedicated.connection.closed:
            dedicated = self._connections[leader] = self.client.dedicated(leader)
        return dedicated

    def close(self) -> None:
        for dedicated in self._connections.values():
            dedicated.connection.close()
        self._connections.clear()

    def release(self) -> None:
        """Done with this producer; connections it shares are left open for the next one."""
        if self._owns_connections:
            self.close()

    def _send(self, leader: int, batches: list[_Outgoing[Tag]]) -> _Request[Tag]:
        dedicated = self._connection(leader)
        conn = dedicated.connection
        version = dedicated.version(ApiKey.PRODUCE, PRODUCE)
        chunks = encode_produce_request(
            version,
            acks=_ACKS_ALL,
            timeout_ms=self.config.request_timeout_ms,
            partitions=[
                PartitionBatch(b.topic, b.partition, b.body, prefix=b.header) for b in batches
            ],
            transactional_id=self.transactional_id,
        )
        try:
            conn.send(ApiKey.PRODUCE, version, chunks)
        except ConnectionFailed as exc:
            raise RetriableError(f"Produce: {exc}") from exc
        return _Request(leader, conn, batches, version)

    def _receive(
        self, request: _Request[Tag], written: list[Written[Tag]], failed: list[_Outgoing[Tag]]
    ) -> RetriableError | None:
        try:
            response = request.conn.receive()
        except ConnectionFailed as exc:
            raise RetriableError(f"Produce: {exc}") from exc
        data = parse_produce_response(response.frame, response.body_offset, response.api_version)
        results = {(r.topic, r.partition): r for r in data.partitions}
        error: RetriableError | None = None
        for batch in request.batches:
            result = results.get((batch.topic, batch.partition))
            where = f"{batch.topic}-{batch.partition}"
            if result is None:
                error = RetriableError(f"Produce: {self.client.where} did not answer for {where}")
                failed.append(batch)
                continue
            code = result.error_code
            if code in (0, _DUPLICATE):
                written.append(
                    Written(
                        batch.topic,
                        batch.partition,
                        result.base_offset if code == 0 else -1,
                        batch.tag,
                    )
                )
            elif is_retriable(code) or (
                code == _OUT_OF_ORDER and self._follows_failure(batch, failed)
            ):
                error = RetriableError(
                    f"Produce to {where}: {self.client.where} answered {error_name(code)}",
                    code=code,
                )
                failed.append(batch)
            elif code in FENCED and self.transactional_id is not None:
                raise FencedError(
                    f"Produce to {where} as transactional id {self.transactional_id!r} was "
                    f"answered {error_name(code)} by {self.client.where}: a newer writer of the "
                    "same id took over (a restarted or retried copy of this task)",
                    code=code,
                )
            else:
                detail = f" ({result.error_message})" if result.error_message else ""
                raise BrokerError(
                    f"the destination refused a write: Produce of the batch for {where} "
                    f"(source: {batch.tag}) was answered {error_name(code)}{detail} by "
                    f"{self.client.where}. Check the destination topic's configs "
                    "(max.message.bytes, policies) and the mirror's permissions",
                    code=code,
                )
        return error

    @staticmethod
    def _follows_failure(batch: _Outgoing[Tag], failed: list[_Outgoing[Tag]]) -> bool:
        """OUT_OF_ORDER_SEQUENCE_NUMBER right after an earlier batch of the same partition
        failed is the expected echo of that failure, not lost producer state."""
        return any(f.topic == batch.topic and f.partition == batch.partition for f in failed)

    def _requeue(self, batches: list[_Outgoing[Tag]]) -> None:
        """Failed batches go back to the front of their queues, in sequence order."""
        for batch in sorted(batches, key=lambda b: b.order, reverse=True):
            self._queues.setdefault((batch.topic, batch.partition), deque()).appendleft(batch)
            self._queued_bytes += batch.size
