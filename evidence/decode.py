"""What the evidence reads from a captured request or response, all of it through kipside.protocol.

Every request is counted by its header (API key, version, correlation id). The bodies read are
those a summary needs: Produce requests (partitions, record batches, records, bytes, acks,
transactional id: the hand-written zero-copy codec, as the proxy reads them), the transaction
coordinator's requests (AddPartitionsToTxn, AddOffsetsToTxn, EndTxn: transactional id, commit
or abort) and InitProducerId and TxnOffsetCommit (transactional id), and the error codes of the
answers to those and to Fetch and FindCoordinator. Everything else stays bytes. A body that does
not decode is reported (`problem`), never raised: a capture is evidence, not a peer to refuse.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, Final

from kipside.protocol import (
    FETCH_MAX_VERSION,
    FETCH_MIN_VERSION,
    PRODUCE_MAX_VERSION,
    PRODUCE_MIN_VERSION,
    ApiKey,
    ProtocolError,
    RecordBatchError,
    count_batches,
    count_produce_request,
    decode_request,
    decode_response,
    known_versions,
    parse_fetch_response,
    parse_response_header,
    produce_response_error_codes,
    request_body_offset,
)

from .frames import Frame

__all__ = ["REQUEST_BODIES", "RESPONSE_BODIES", "RequestSeen", "ResponseSeen"]

_HEADER: Final = struct.Struct(">hhi")  # api key, api version, correlation id
_CORRELATION_ID: Final = struct.Struct(">i")
_INT16: Final = struct.Struct(">h")
TRANSACTION_CALLS: Final = frozenset(
    {ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN}
)
"""The transaction coordinator's round trips within one transaction."""
REQUEST_BODIES: Final = frozenset(
    {ApiKey.PRODUCE, ApiKey.INIT_PRODUCER_ID, ApiKey.TXN_OFFSET_COMMIT, *TRANSACTION_CALLS}
)
RESPONSE_BODIES: Final = frozenset(
    {
        ApiKey.PRODUCE,
        ApiKey.FETCH,
        ApiKey.FIND_COORDINATOR,
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.TXN_OFFSET_COMMIT,
        *TRANSACTION_CALLS,
    }
)


class RequestSeen:
    """One captured request: its header, and what its body says if it was read."""

    __slots__ = (
        "acks",
        "api_key",
        "api_version",
        "batch_bytes",
        "batches",
        "committed",
        "correlation_id",
        "corrupt_batches",
        "partitions",
        "problem",
        "records",
        "transactional_id",
        "ts",
    )

    def __init__(self, api_key: int, api_version: int, correlation_id: int, ts: float) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.ts = ts
        self.acks: int | None = None
        self.transactional_id: str | None = None
        self.committed: bool | None = None
        self.partitions = 0
        self.batches = 0
        self.records = 0
        self.batch_bytes = 0
        self.corrupt_batches = 0
        """Batches whose CRC does not match (their records are not counted)."""
        self.problem: str | None = None
        """Why the body was not read (bytes lost in the capture, or it does not decode)."""

    @property
    def expects_response(self) -> bool:
        return self.api_key != ApiKey.PRODUCE or self.acks != 0

    @classmethod
    def read(cls, frame: Frame) -> RequestSeen:
        api_key, api_version, correlation_id = _HEADER.unpack_from(frame.data, 4)
        request = cls(api_key, api_version, correlation_id, frame.ts)
        if frame.damaged:
            request.problem = "bytes lost in the capture"
        elif frame.complete and api_key in REQUEST_BODIES:
            try:
                request._read_body(frame.data)
            except (ProtocolError, RecordBatchError) as exc:
                request.problem = str(exc)
        return request

    def _read_body(self, data: bytes) -> None:
        body_offset = request_body_offset(data)
        key, version = self.api_key, self.api_version
        if key == ApiKey.PRODUCE and PRODUCE_MIN_VERSION <= version <= PRODUCE_MAX_VERSION:
            counts = count_produce_request(data, body_offset, version)
            self.acks = counts.acks
            self.transactional_id = counts.transactional_id
            self.partitions = counts.partitions
            self.batches = counts.batches
            self.records = counts.records
            self.batch_bytes = counts.batch_bytes
            self.corrupt_batches = counts.corrupt_batches
            return
        message = decode_request(key, version, data, body_offset)
        if key == ApiKey.PRODUCE:  # v13+ (topic ids): kio's classes
            self.acks = int(message.acks)
            self.transactional_id = message.transactional_id
            for topic in message.topic_data:
                for partition in topic.partition_data:
                    self.partitions += 1
                    if partition.records is not None:
                        self._count_batches(memoryview(partition.records))
        elif key == ApiKey.ADD_PARTITIONS_TO_TXN:
            if version <= 3:
                self.transactional_id = str(message.v3_and_below_transactional_id)
            elif message.transactions:  # v4+: the broker-to-broker batch form
                self.transactional_id = str(message.transactions[0].transactional_id)
        else:
            self.transactional_id = message.transactional_id
            if key == ApiKey.END_TXN:
                self.committed = bool(message.committed)

    def _count_batches(self, records: memoryview) -> None:
        batches, count, corrupt = count_batches(records)
        self.batch_bytes += len(records)
        self.batches += batches
        self.records += count
        self.corrupt_batches += corrupt


class ResponseSeen:
    """One captured response: the error codes it carries (each once), if its body was read."""

    __slots__ = ("error_codes", "problem")

    def __init__(self, error_codes: frozenset[int] = frozenset(), problem: str | None = None):
        self.error_codes = error_codes
        self.problem = problem

    @classmethod
    def read(cls, request: RequestSeen, frame: Frame) -> ResponseSeen:
        if frame.damaged:
            return cls(problem="bytes lost in the capture")
        if not frame.complete or request.api_key not in RESPONSE_BODIES:
            return cls()
        try:
            return cls(_error_codes(request.api_key, request.api_version, frame.data))
        except (ProtocolError, RecordBatchError) as exc:
            return cls(problem=str(exc))


def plausible_first_request(frame: Frame) -> bool:
    """Whether the first frame of a connection reads as a Kafka request header (an API key and
    version kipside knows, a client id that fits): told apart from other protocols whose first
    bytes happen to look like a size and an API key."""
    if len(frame.data) < 14:
        return False
    api_key, api_version, _ = _HEADER.unpack_from(frame.data, 4)
    versions = known_versions(api_key)
    if versions is None or not versions[0] <= api_version <= versions[1] + 8:
        return False
    client_id_length: int = _INT16.unpack_from(frame.data, 12)[0]
    return -1 <= client_id_length <= frame.size - 10


def correlation_id(frame: Frame) -> int:
    """A response frame's correlation id."""
    return int(_CORRELATION_ID.unpack_from(frame.data, 4)[0])


def _error_codes(api_key: int, api_version: int, data: bytes) -> frozenset[int]:
    header = parse_response_header(data, api_key, api_version)
    offset = header.body_offset
    if api_key == ApiKey.PRODUCE and PRODUCE_MIN_VERSION <= api_version <= PRODUCE_MAX_VERSION:
        return frozenset(produce_response_error_codes(data, offset, api_version))
    if api_key == ApiKey.FETCH and FETCH_MIN_VERSION <= api_version <= FETCH_MAX_VERSION:
        fetch = parse_fetch_response(data, offset, api_version)
        return frozenset({fetch.error_code, *(p.error_code for p in fetch.partitions)})
    return frozenset(_walk_error_codes(decode_response(api_key, api_version, data, offset)))


def _walk_error_codes(message: Any) -> set[int]:
    """Every error code anywhere in a kio message (`error_code`, `partition_error_code`...)."""
    found: set[int] = set()
    for f in dataclasses.fields(message):
        value = getattr(message, f.name)
        if f.name.endswith("error_code") and value is not None:
            found.add(int(value))
        elif dataclasses.is_dataclass(value):
            found |= _walk_error_codes(value)
        elif isinstance(value, tuple):
            for item in value:
                if dataclasses.is_dataclass(item):
                    found |= _walk_error_codes(item)
    return found
