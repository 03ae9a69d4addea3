"""The simulated cluster itself (relaykit.cluster: ONE Tansu presented as nodes 1, 2, 3), asked
directly over raw sockets, no kipside: it must answer as an Apache Kafka cluster would, or the
several-brokers tests would prove nothing.

- test_simulation_answers_as_a_cluster_does: Metadata spreads the leaders and lists the three
  nodes (leader epochs, replicas, controller); a moved leader shows in Metadata with a new
  epoch; a Fetch naming a partition the node leads and one it does not gets both answers in
  request order (NOT_LEADER_OR_FOLLOWER naming the new leader); stale and future leader epochs
  are FENCED_LEADER_EPOCH and UNKNOWN_LEADER_EPOCH; ListOffsets is refused off the leader;
  FindCoordinator (v3 and v4) names each key's coordinator; group requests elsewhere get
  NOT_COORDINATOR (OffsetCommit per partition) and never reach Tansu; DescribeCluster lists the
  nodes; a removed node leaves Metadata, its leaders move, its port refuses connections.

Run: .venv/bin/pytest tests/integration/test_cluster_simulation.py -q -p no:cacheprovider
"""

from __future__ import annotations

import itertools
import socket
from typing import Any

import pytest
from conftest import create_topics, unique_name
from relaykit.cluster import SimulatedCluster, simulated_cluster
from relaykit.kafka_answers import (
    FENCED_LEADER_EPOCH,
    GROUP,
    NOT_COORDINATOR,
    NOT_LEADER,
    TRANSACTION,
    UNKNOWN_LEADER_EPOCH,
)

from kipside.protocol import ApiKey
from kipside.protocol.headers import build_frame, encode_request_header, parse_response_header
from kipside.protocol.messages import build_request, decode_response, encode_message

from .raw_batches import read_frame

pytestmark = pytest.mark.integration

_correlation = itertools.count(1)
METADATA_FIELDS = {"allow_auto_topic_creation": False, "include_topic_authorized_operations": False}


def call(port: int, api_key: int, version: int, fields: dict[str, Any]) -> Any:
    """One request on a new connection to 127.0.0.1:port; the decoded answer."""
    header = encode_request_header(api_key, version, next(_correlation), "kipside-it-sim")
    frame = build_frame(header, encode_message(build_request(api_key, version, fields)))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(frame)
        answer = read_frame(sock)
    offset = parse_response_header(answer, api_key, version).body_offset
    return decode_response(api_key, version, answer, offset)


def _metadata(port: int, topic: str) -> Any:
    topics = [{"name": topic, "topic_id": None}]
    return call(port, ApiKey.METADATA, 12, {"topics": topics, **METADATA_FIELDS})


def _fetch(port: int, topic: str, partitions: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Fetch v12 of (partition, current leader epoch): [(partition, error)] as answered."""
    parts = [
        {"partition": p, "current_leader_epoch": e, "fetch_offset": 0, "partition_max_bytes": 1024}
        for p, e in partitions
    ]
    answer = call(
        port,
        ApiKey.FETCH,
        12,
        {
            "replica_id": -1,
            "max_wait": 100,  # Tansu 0.6.0 answers max_wait 0 with no partitions at all
            "min_bytes": 0,
            "topics": [{"topic": topic, "partitions": parts}],
            "forgotten_topics_data": [],
        },
    )
    return [
        (int(p.partition_index), int(p.error_code)) for t in answer.responses for p in t.partitions
    ]


def test_simulation_answers_as_a_cluster_does(request: pytest.FixtureRequest) -> None:
    with simulated_cluster() as cluster:
        port = {n: cluster.port(n) for n in cluster.nodes()}
        topic = unique_name("sim", request)
        create_topics(cluster.bootstrap, [topic], 6)
        _metadata_spreads_the_leaders(port, topic)
        _a_moved_leader_is_answered_as_kafka_does(cluster, port, topic)
        group, txn = unique_name("g", request), unique_name("t", request)
        _find_coordinator_names_each_keys_coordinator(cluster, port, group, txn)
        _group_requests_elsewhere_are_not_coordinator(cluster, port, topic, group)
        described = call(
            port[1], ApiKey.DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": False}
        )
        assert [(b.broker_id, b.port) for b in described.brokers] == sorted(port.items())
        _a_removed_node_leaves_the_cluster(cluster, port, topic)
        assert not cluster.problems(), cluster.problems()


def _metadata_spreads_the_leaders(port: dict[int, int], topic: str) -> None:
    """Metadata lists the three nodes and node 1 as controller; the leaders go round the
    nodes, at leader epoch 0, each leader first among its replicas."""
    md = _metadata(port[2], topic)
    assert [(b.node_id, b.port) for b in md.brokers] == sorted(port.items())
    assert md.controller_id == 1
    leaders = [(p.leader_id, p.leader_epoch, p.replica_nodes) for p in md.topics[0].partitions]
    assert [(n, e, r[0]) for n, e, r in leaders] == [(n, 0, n) for n in (1, 2, 3, 1, 2, 3)]


def _a_moved_leader_is_answered_as_kafka_does(
    cluster: SimulatedCluster, port: dict[int, int], topic: str
) -> None:
    """Partition 0 moves from node 1 to node 2: Metadata shows epoch 1; Fetch is refused off
    the leader (in request order beside a partition it still leads) and fenced or unknown at a
    stale or future epoch; ListOffsets is refused off the leader."""
    assert cluster.move_leader(topic, 0, 2) == 1
    md = _metadata(port[3], topic)
    assert (md.topics[0].partitions[0].leader_id, md.topics[0].partitions[0].leader_epoch) == (
        2,
        1,
    )
    # Node 1 still leads partition 3, no longer partition 0: both answered, in order.
    assert _fetch(port[1], topic, [(0, 1), (3, 0)]) == [(0, NOT_LEADER), (3, 0)]
    assert _fetch(port[2], topic, [(0, 0)]) == [(0, FENCED_LEADER_EPOCH)]
    assert _fetch(port[2], topic, [(0, 2)]) == [(0, UNKNOWN_LEADER_EPOCH)]
    assert _fetch(port[2], topic, [(0, 1)]) == _fetch(port[2], topic, [(0, -1)]) == [(0, 0)]
    offsets = call(
        port[1],
        ApiKey.LIST_OFFSETS,
        7,
        {
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
        },
    )
    assert offsets.topics[0].partitions[0].error_code == NOT_LEADER


def _find_coordinator_names_each_keys_coordinator(
    cluster: SimulatedCluster, port: dict[int, int], group: str, txn: str
) -> None:
    """FindCoordinator v3 (one key) and v4 (a list of keys), asked of any node, name the
    node the cluster chose for the group and for the transactional id."""
    for key_type, key in ((GROUP, group), (TRANSACTION, txn)):
        node = cluster.coordinator(key_type, key)
        v3 = call(port[1], ApiKey.FIND_COORDINATOR, 3, {"key": key, "key_type": key_type})
        assert (v3.error_code, v3.node_id, v3.port) == (0, node, port[node])
        v4 = call(
            port[3],
            ApiKey.FIND_COORDINATOR,
            4,
            {"key_type": key_type, "coordinator_keys": [key]},
        )
        assert [(c.key, c.node_id, c.port) for c in v4.coordinators] == [(key, node, port[node])]


def _group_requests_elsewhere_are_not_coordinator(
    cluster: SimulatedCluster, port: dict[int, int], topic: str, group: str
) -> None:
    """A Heartbeat and an OffsetCommit (per partition) sent to a node that is not the
    group's coordinator are NOT_COORDINATOR, answered by the node and counted as refused."""
    elsewhere = next(n for n in port if n != cluster.coordinator(GROUP, group))
    before = cluster.record(elsewhere).requests
    heartbeat = {"group_id": group, "generation_id": 1, "member_id": "m"}
    assert call(port[elsewhere], ApiKey.HEARTBEAT, 4, heartbeat).error_code == NOT_COORDINATOR
    commit = call(
        port[elsewhere],
        ApiKey.OFFSET_COMMIT,
        8,
        {
            "group_id": group,
            "member_id": "",
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {
                            "partition_index": p,
                            "committed_offset": 0,
                            "committed_metadata": None,
                        }
                        for p in (0, 1)
                    ],
                }
            ],
        },
    )
    assert [(p.partition_index, p.error_code) for p in commit.topics[0].partitions] == [
        (0, NOT_COORDINATOR),
        (1, NOT_COORDINATOR),
    ]
    refused = cluster.record(elsewhere).refused
    assert refused[(ApiKey.HEARTBEAT, NOT_COORDINATOR)] == 1
    assert cluster.record(elsewhere).requests[ApiKey.HEARTBEAT] == before[ApiKey.HEARTBEAT] + 1


def _a_removed_node_leaves_the_cluster(
    cluster: SimulatedCluster, port: dict[int, int], topic: str
) -> None:
    """Node 3 removed: Metadata lists nodes 1 and 2, its partitions lead elsewhere at a new
    epoch, and its port refuses connections."""
    cluster.remove_node(3)
    md = _metadata(port[1], topic)
    assert [b.node_id for b in md.brokers] == [1, 2]
    moved = {p.partition_index: (p.leader_id, p.leader_epoch) for p in md.topics[0].partitions}
    assert moved[2] == (cluster.leader(topic, 2)[0], 1) and moved[2][0] in (1, 2)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port[3]), timeout=5).close()
