"""protocol.produce: the fast node-endpoint check agrees with the full reader."""

from __future__ import annotations

import pytest

from kipside.protocol.produce import (
    MAX_VERSION,
    NodeEndpointData,
    PartitionResult,
    ProduceResponseData,
    encode_produce_response,
    parse_produce_response,
    produce_response_names_nodes,
)

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
