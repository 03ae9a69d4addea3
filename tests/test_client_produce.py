"""A coalesced ProduceResponse split per client: each client's answer names only the leaders of
its own partitions (Apache Kafka lists the endpoints of the leaders its answer names, KIP-951),
rewritten to kipside's listeners, whatever other clients' partitions the upstream answer
carried."""

from __future__ import annotations

from typing import Any

from kipside.protocol import (
    ApiKey,
    NodeEndpointData,
    PartitionResult,
    parse_produce_response,
    parse_response_header,
)
from kipside.protocol.kafka_errors import ErrorCode
from kipside.proxy.stages.coalescing.client_produce import ClientProduce
from kipside.proxy.upstream.nodes import NodeMap

NOT_LEADER = int(ErrorCode.not_leader_or_follower)
VERSION = 11
UPSTREAM_ENDPOINTS = (
    NodeEndpointData(2, "broker-2.internal", 9092, None),
    NodeEndpointData(3, "broker-3.internal", 9092, "rack-c"),
)


def _answer(
    owner: ClientProduce,
) -> tuple[list[tuple[int, int, tuple[int, int] | None]], list[Any]]:
    frame = owner.pending.frame
    assert frame is not None
    offset = parse_response_header(frame, ApiKey.PRODUCE, VERSION).body_offset
    response = parse_produce_response(frame, offset, VERSION)
    results = [(r.partition, r.error_code, r.current_leader) for r in response.partitions]
    endpoints = [(e.node_id, e.host, e.port, e.rack) for e in response.node_endpoints]
    return results, endpoints


def test_each_client_gets_the_endpoints_of_its_own_partitions_leaders() -> None:
    nodes = NodeMap(advertise_host="kipside.local", node_port_base=9000)
    moved = ClientProduce(1, VERSION, [("t", 0), ("t", 1)], nodes)
    stayed = ClientProduce(2, VERSION, [("t", 3)], nodes)
    # One upstream answer carried both clients' partitions and named nodes 2 and 3.
    moved.answer(PartitionResult("t", 0, 0, base_offset=10), 0, UPSTREAM_ENDPOINTS)
    moved.answer(PartitionResult("t", 1, NOT_LEADER, current_leader=(3, 4)), 0, UPSTREAM_ENDPOINTS)
    stayed.answer(PartitionResult("t", 3, 0, base_offset=20), 0, UPSTREAM_ENDPOINTS)

    assert _answer(moved) == (
        [(0, 0, None), (1, NOT_LEADER, (3, 4))],
        [(3, "kipside.local", 9003, "rack-c")],
    )
    assert _answer(stayed) == ([(3, 0, None)], [])
