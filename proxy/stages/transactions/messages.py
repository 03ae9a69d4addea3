"""The transaction-API messages kipside itself writes upstream, and the reading of their answers.

AddPartitionsToTxn v0-3 and AddOffsetsToTxn for pre-registration, EndTxn to abort a transaction
the client doesn't know about, DescribeTransactions to ask whether a transaction's markers are
written, Metadata for a declared topic's partitions; built and read with kio's classes.
Frames only: this module never touches a connection.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from kio.static.primitive import i16, i32

from kipside.protocol import (
    ApiKey,
    ErrorCode,
    Message,
    RequestHeader,
    build_frame,
    decode_response,
    encode_message,
    encode_request_header,
    field_entity,
    parse_response_header,
    request_class,
)
from kipside.proxy.stages.transactions.state import Producer, TopicPartition

MAX_CLIENT_ADD_PARTITIONS_VERSION: Final = 3  # v4+ is broker-to-broker only
ADD_OFFSETS_VERSION: Final = 0
END_TXN_VERSION: Final = 0
METADATA_VERSION: Final = 4  # the first version that can say "don't auto-create"
DESCRIBE_TRANSACTIONS_VERSION: Final = 0

MARKERS_PENDING: Final = frozenset({"PrepareCommit", "PrepareAbort", "PrepareEpochFence"})
"""DescribeTransactions states in which the coordinator still writes the last transaction's
markers and refuses a new registration (TransactionCoordinator: CONCURRENT_TRANSACTIONS). In
every other state (Empty, Ongoing, CompleteCommit, CompleteAbort, Dead) a registration is
answered on its merits."""


def transactional_id(header: RequestHeader, request: Message) -> str | None:
    """The transactional id a client's transaction request names."""
    if header.api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
        txn_id: str | None = request.v3_and_below_transactional_id
    else:
        txn_id = request.transactional_id
    return txn_id


def decode_answer(api_key: int, version: int, frame: bytes) -> Message:
    header = parse_response_header(frame, api_key, version)
    return decode_response(api_key, version, frame, header.body_offset)


def _frame(api_key: int, version: int, message: Message, client_id: str) -> bytes:
    return build_frame(
        encode_request_header(api_key, version, 0, client_id), encode_message(message)
    )


def add_partitions_request(
    transactional_id: str,
    producer: Producer,
    version: int,
    partitions: Iterable[TopicPartition],
    client_id: str,
) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    cls = request_class(ApiKey.ADD_PARTITIONS_TO_TXN, version)
    topic_cls = field_entity(cls, "v3_and_below_topics")
    message = cls(
        v3_and_below_transactional_id=transactional_id,
        v3_and_below_producer_id=producer.id,
        v3_and_below_producer_epoch=i16(producer.epoch),
        v3_and_below_topics=tuple(
            topic_cls(name=name, partitions=tuple(i32(p) for p in ps))
            for name, ps in by_topic.items()
        ),
    )
    return _frame(ApiKey.ADD_PARTITIONS_TO_TXN, version, message, client_id)


def add_partitions_errors(version: int, frame: bytes) -> dict[TopicPartition, int]:
    """Each partition's error code in an AddPartitionsToTxn v0-3 answer."""
    response = decode_answer(ApiKey.ADD_PARTITIONS_TO_TXN, version, frame)
    return {
        (topic.name, int(p.partition_index)): int(p.partition_error_code)
        for topic in response.results_by_topic_v3_and_below
        for p in topic.results_by_partition
    }


def _producer_request(
    api_key: int,
    version: int,
    transactional_id: str,
    producer: Producer,
    client_id: str,
    **fields: object,
) -> bytes:
    """A request of one transactional producer: the id and epoch fields AddOffsetsToTxn and
    EndTxn share, plus `fields`."""
    message = request_class(api_key, version)(
        transactional_id=transactional_id,
        producer_id=producer.id,
        producer_epoch=i16(producer.epoch),
        **fields,
    )
    return _frame(api_key, version, message, client_id)


def add_offsets_request(
    transactional_id: str, producer: Producer, group: str, client_id: str
) -> bytes:
    return _producer_request(
        ApiKey.ADD_OFFSETS_TO_TXN,
        ADD_OFFSETS_VERSION,
        transactional_id,
        producer,
        client_id,
        group_id=group,
    )


def abort_request(transactional_id: str, producer: Producer, client_id: str) -> bytes:
    """EndTxn, aborting the producer's current transaction."""
    return _producer_request(
        ApiKey.END_TXN, END_TXN_VERSION, transactional_id, producer, client_id, committed=False
    )


def metadata_request(topic: str) -> bytes:
    """Metadata for one topic, never creating it."""
    cls = request_class(ApiKey.METADATA, METADATA_VERSION)
    topic_cls = field_entity(cls, "topics")
    message = cls(topics=(topic_cls(name=topic),), allow_auto_topic_creation=False)
    return _frame(ApiKey.METADATA, METADATA_VERSION, message, "kipside")


def topic_partitions(frame: bytes, topic: str) -> tuple[int, ...] | None:
    """The topic's partition ids in a Metadata answer to metadata_request; None if the broker
    does not know it."""
    response = decode_answer(ApiKey.METADATA, METADATA_VERSION, frame)
    partitions: tuple[int, ...] | None = None
    for entry in response.topics:
        if entry.name == topic and entry.error_code == ErrorCode.none:
            partitions = tuple(sorted(int(p.partition_index) for p in entry.partitions))
    return partitions


def describe_transactions_request(transactional_id: str, client_id: str) -> bytes:
    cls = request_class(ApiKey.DESCRIBE_TRANSACTIONS, DESCRIBE_TRANSACTIONS_VERSION)
    message = cls(transactional_ids=(transactional_id,))
    return _frame(ApiKey.DESCRIBE_TRANSACTIONS, DESCRIBE_TRANSACTIONS_VERSION, message, client_id)


def markers_written(frame: bytes, transactional_id: str) -> bool | None:
    """Whether a DescribeTransactions answer says the id's last transaction's markers are
    written (False: still being written); None when it gives no state for the id (an error:
    not authorized, not the coordinator, loading)."""
    response = decode_answer(ApiKey.DESCRIBE_TRANSACTIONS, DESCRIBE_TRANSACTIONS_VERSION, frame)
    for state in response.transaction_states:
        if state.transactional_id == transactional_id and state.error_code == ErrorCode.none:
            return str(state.transaction_state) not in MARKERS_PENDING
    return None
