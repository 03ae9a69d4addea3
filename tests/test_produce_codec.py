"""protocol.produce: the fast readers (the node-endpoint check, the counting readers of requests
and responses) agree with the full readers."""

from __future__ import annotations

import pytest

from kipside.protocol.batch_builder import Record, encode_batch
from kipside.protocol.errors import DecodeError
from kipside.protocol.produce import (
    MAX_VERSION,
    MIN_VERSION,
    NodeEndpointData,
    PartitionBatch,
    PartitionResult,
    ProduceCounts,
    ProduceResponseData,
    count_produce_request,
    encode_produce_request,
    encode_produce_response,
    parse_produce_request,
    parse_produce_response,
    produce_response_error_codes,
    produce_response_names_nodes,
)
from kipside.protocol.records import RecordBatchError, count_batches, iter_batches

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


@pytest.mark.parametrize("version", range(10, MAX_VERSION + 1))
@pytest.mark.parametrize("endpoints", [(), ENDPOINTS], ids=["no-endpoints", "endpoints"])
@pytest.mark.parametrize("results", [(), RESULTS], ids=["no-topics", "three-partitions"])
def test_fast_check_matches_the_full_reader(
    version: int,
    endpoints: tuple[NodeEndpointData, ...],
    results: tuple[PartitionResult, ...],
) -> None:
    body = encode_produce_response(version, ProduceResponseData(results, 5, endpoints))
    frame = b"\x00" * 8 + body  # the readers take a frame and the body's offset in it
    full = parse_produce_response(frame, 8, version)
    assert full.node_endpoints == endpoints
    assert produce_response_names_nodes(frame, 8, version) is bool(endpoints)


def test_older_versions_never_name_nodes() -> None:
    body = encode_produce_response(9, ProduceResponseData(RESULTS, 0, ()))
    assert produce_response_names_nodes(b"\x00" * 8 + body, 8, 9) is False


# --------------------------------------------------------------------------- counting readers


def _batches(count: int, records: int) -> bytes:
    return b"".join(
        encode_batch(
            [Record(b"k", b"v" * n) for n in range(records)], base_timestamp=1_700_000_000_000
        )
        for _ in range(count)
    )


PARTITIONS = (
    PartitionBatch("orders", 0, memoryview(_batches(1, 3))),
    PartitionBatch("orders", 1, memoryview(_batches(2, 1))),
    PartitionBatch("payments", 7, None),
    PartitionBatch("payments", 2, memoryview(_batches(3, 5))),
)


@pytest.mark.parametrize("version", range(MIN_VERSION, MAX_VERSION + 1))
@pytest.mark.parametrize("transactional_id", [None, "txn-1"])
def test_counting_a_request_matches_the_full_reader(
    version: int, transactional_id: str | None
) -> None:
    body = b"".join(
        bytes(chunk)
        for chunk in encode_produce_request(
            version,
            acks=-1,
            timeout_ms=1000,
            partitions=PARTITIONS,
            transactional_id=transactional_id,
        )
    )
    frame = b"\x00" * 8 + body
    full = parse_produce_request(frame, 8, version)
    batches = [b for p in full.partitions if p.records is not None for b in iter_batches(p.records)]
    counts = count_produce_request(frame, 8, version)
    assert counts == ProduceCounts(
        transactional_id,
        -1,
        len(full.partitions),
        len(batches),
        sum(b.records_count for b in batches),
        sum(len(p.records) for p in full.partitions if p.records is not None),
        0,
    )


def test_a_batch_failing_its_crc_is_counted_apart() -> None:
    good, bad = bytearray(_batches(1, 4)), bytearray(_batches(1, 9))
    bad[-1] ^= 0xFF  # a record byte: covered by the CRC
    assert count_batches(bytes(good + bad)) == (2, 4, 1)
    with pytest.raises(RecordBatchError):
        count_batches(bytes(good[:-1]))  # a batch cut short


@pytest.mark.parametrize("version", range(MIN_VERSION, MAX_VERSION + 1))
@pytest.mark.parametrize("results", [(), RESULTS], ids=["no-topics", "three-partitions"])
def test_error_codes_match_the_full_reader(
    version: int, results: tuple[PartitionResult, ...]
) -> None:
    endpoints = ENDPOINTS if version >= 10 else ()
    body = encode_produce_response(version, ProduceResponseData(results, 5, endpoints))
    frame = b"\x00" * 8 + body
    full = parse_produce_response(frame, 8, version)
    assert produce_response_error_codes(frame, 8, version) == {
        p.error_code for p in full.partitions
    }
    with pytest.raises(DecodeError):
        produce_response_error_codes(frame + b"\x00", 8, version)
