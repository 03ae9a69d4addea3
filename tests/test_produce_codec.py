"""protocol.produce: the fast readers (the node-endpoint check, the counting readers of requests
and responses) agree with the full readers."""

from __future__ import annotations

import pytest
from testkit.produce_frames import (
    ENDPOINTS,
    HEAD,
    RESULTS,
    batches,
    request_frame,
    response_frame,
)

from kipside.protocol.errors import DecodeError
from kipside.protocol.produce import (
    MAX_VERSION,
    MIN_VERSION,
    NodeEndpointData,
    PartitionResult,
    ProduceCounts,
    count_produce_request,
    parse_produce_request,
    parse_produce_response,
    produce_response_error_codes,
    produce_response_names_nodes,
)
from kipside.protocol.records import RecordBatchError, count_batches, iter_batches

BODY = len(HEAD)  # where the readers find the body in a frame


@pytest.mark.parametrize("version", range(10, MAX_VERSION + 1))
@pytest.mark.parametrize("endpoints", [(), ENDPOINTS], ids=["no-endpoints", "endpoints"])
@pytest.mark.parametrize("results", [(), RESULTS], ids=["no-topics", "three-partitions"])
def test_fast_check_matches_the_full_reader(
    version: int,
    endpoints: tuple[NodeEndpointData, ...],
    results: tuple[PartitionResult, ...],
) -> None:
    frame = response_frame(version, results, endpoints)
    full = parse_produce_response(frame, BODY, version)
    assert full.node_endpoints == endpoints
    assert produce_response_names_nodes(frame, BODY, version) is bool(endpoints)


def test_older_versions_never_name_nodes() -> None:
    assert produce_response_names_nodes(response_frame(9, RESULTS, ()), BODY, 9) is False


# --------------------------------------------------------------------------- counting readers


@pytest.mark.parametrize("version", range(MIN_VERSION, MAX_VERSION + 1))
@pytest.mark.parametrize("transactional_id", [None, "txn-1"])
def test_counting_a_request_matches_the_full_reader(
    version: int, transactional_id: str | None
) -> None:
    frame = request_frame(version, transactional_id)
    full = parse_produce_request(frame, BODY, version)
    read = [b for p in full.partitions if p.records is not None for b in iter_batches(p.records)]
    counts = count_produce_request(frame, BODY, version)
    assert counts == ProduceCounts(
        transactional_id,
        -1,
        len(full.partitions),
        len(read),
        sum(b.records_count for b in read),
        sum(len(p.records) for p in full.partitions if p.records is not None),
        0,
    )


def test_a_batch_failing_its_crc_is_counted_apart() -> None:
    good, bad = bytearray(batches(1, 4)), bytearray(batches(1, 9))
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
    frame = response_frame(version, results, endpoints)
    full = parse_produce_response(frame, BODY, version)
    assert produce_response_error_codes(frame, BODY, version) == {
        p.error_code for p in full.partitions
    }
    with pytest.raises(DecodeError):
        produce_response_error_codes(frame + b"\x00", BODY, version)
