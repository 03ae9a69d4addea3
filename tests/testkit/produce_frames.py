"""Valid ProduceRequest and ProduceResponse frames, as kipside.protocol.produce writes them.

The codec tests (tests/test_produce_codec.py) check the fast readers against the full ones on
them, and the fuzz tests (tests/fuzz/test_fuzz_codecs.py) corrupt them. A frame here is HEAD and
then the body: the readers take a frame and the offset of its body, len(HEAD).
"""

from __future__ import annotations

from collections.abc import Sequence

from kipside.protocol.batch_builder import Record, encode_batch
from kipside.protocol.produce import (
    NodeEndpointData,
    PartitionBatch,
    PartitionResult,
    ProduceResponseData,
    encode_produce_request,
    encode_produce_response,
)

HEAD = b"\x00" * 8  # a frame's size and response header (or request head) before a body

# Three partitions of two topics: a success, a refusal with every field a refusal can carry
# (record errors, a message, the current leader), a success with LogAppendTime.
RESULTS = (
    PartitionResult("orders", 0, 0, base_offset=41, log_start_offset=0),
    PartitionResult(
        "orders",
        1,
        6,
        record_errors=((0, "bad record"), (3, None)),
        error_message="not the leader",
        current_leader=(2, 7),
    ),
    PartitionResult("payments", 5, 0, base_offset=9, log_append_time_ms=1_700_000_000_000),
)
ENDPOINTS = (NodeEndpointData(2, "broker-2.internal", 9092, "rack-a"),)


def batches(count: int, records: int) -> bytes:
    """`count` record batches of `records` records each (values of 0 to records-1 bytes)."""
    return b"".join(
        encode_batch(
            [Record(b"k", b"v" * n) for n in range(records)], base_timestamp=1_700_000_000_000
        )
        for _ in range(count)
    )


# Partitions of one, two, none and three batches.
PARTITIONS = (
    PartitionBatch("orders", 0, memoryview(batches(1, 3))),
    PartitionBatch("orders", 1, memoryview(batches(2, 1))),
    PartitionBatch("payments", 7, None),
    PartitionBatch("payments", 2, memoryview(batches(3, 5))),
)


def request_frame(
    version: int,
    transactional_id: str | None = None,
    partitions: Sequence[PartitionBatch] = PARTITIONS,
) -> bytes:
    """A ProduceRequest at `version` with acks=-1."""
    chunks = encode_produce_request(
        version,
        acks=-1,
        timeout_ms=30_000,
        partitions=partitions,
        transactional_id=transactional_id,
    )
    return HEAD + b"".join(bytes(chunk) for chunk in chunks)


def response_frame(
    version: int,
    results: tuple[PartitionResult, ...] = RESULTS,
    endpoints: tuple[NodeEndpointData, ...] = ENDPOINTS,
) -> bytes:
    """A ProduceResponse at `version` (throttled 5 ms); `endpoints` are written from v10 on."""
    return HEAD + encode_produce_response(version, ProduceResponseData(results, 5, endpoints))
