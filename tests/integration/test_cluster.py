"""Several brokers and leader moves, produce side: real clients -> kipside -> a
SIMULATED 3-node cluster (relaykit.cluster.SimulatedCluster: ONE Tansu behind one relay port
per fake node id; it spreads partition leaders over nodes 1-3, refuses partitions a node does
not lead as Apache Kafka does, and records what kipside sent each node).

- test_produce_coalesces_per_leader[client]: three producers of one client library at once on
  a 6-partition topic (two partitions per node): nothing refused (kipside sent every batch to
  its partition's leader), each node forwarded exactly its own partitions, fewer upstream than
  client ProduceRequests and, for idempotent clients, upstream requests carrying several
  producers' batches on every node; everything consumed once, in order.
- test_produce_through_leader_moves[client]: two producers while a partition leader moves
  every 0.15 s: old leaders refuse batches (NOT_LEADER_OR_FOLLOWER, through kipside to the
  clients), the clients refresh metadata and resend to the new leaders through kipside, and
  nothing is lost, duplicated or reordered.
- test_not_leader_answer_is_the_brokers: one raw Produce v11 naming a partition the node leads
  and one it does not, to kipside's listener and to the simulated node itself: the same answer
  (error, current leader, its endpoint), the endpoint rewritten to kipside's listener, on the
  coalesced path (the request waits behind another client's on node 1's one lane, so kipside
  writes it); the nodes test below checks the same on the pass-through path.
- test_nodes_join_and_leave_mid_traffic (its own kipside, linger 0: the pass-through path):
  node 4 joins and leads two partitions, node 3 leaves, mid-traffic: kipside opens node 4's
  listener from Metadata, ends what it had open to node 3, keeps node 3's listener (its port
  stays) and closes clients that dial it with a log line; nothing acknowledged is lost.

Run: .venv/bin/pytest tests/integration/test_cluster.py -q -p no:cacheprovider
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from conftest import DIRECT, ONE_TO_ONE, fresh_topic

from kipside.protocol import (
    ApiKey,
    PartitionBatch,
    ProduceResponseData,
    encode_batch,
    encode_produce_request,
    encode_request_header,
    parse_produce_response,
    parse_response_header,
)
from kipside.protocol.batch_builder import Record
from kipside.protocol.kafka_errors import ErrorCode

from .clients import Msg, assert_exactly_once_in_order, make_messages
from .clients_read_back import consume_assigned
from .cluster_kit import (
    CLIENTS,
    IDEMPOTENT,
    NODES,
    PARTITIONS,
    Background,
    ClusterStack,
    Mover,
    cluster_stack,
    produce_concurrently,
    topic_traffic,
)
from .raw_batches import read_frame

pytestmark = pytest.mark.integration

# One lane per node, and batches wait 5 ms for company: a node's two partitions share a lane,
# so batches of different producers (one per partition) meet in one upstream request.
RULES = "coalescing:\n  lanes: 1\n  linger_ms: 5\n"
NOT_LEADER = int(ErrorCode.not_leader_or_follower)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterStack]:
    if DIRECT:
        pytest.skip("KIPSIDE_TEST_DIRECT=1: these tests are about kipside in front of a cluster")
    with cluster_stack(tmp_path_factory.mktemp("cluster"), RULES) as s:
        yield s


def _check_received(sends: dict[str, list[Msg]], bootstrap: str, topic: str, raw: int = 0) -> None:
    """Each producer's messages arrived once, in its order per partition, and besides them
    only `raw` records (written by hand) are in the log."""
    expect = sum(len(m) for m in sends.values()) + raw
    got, marks = consume_assigned(bootstrap, topic, PARTITIONS, expect)
    for tag, sent in sends.items():
        mine = [m for m in got if m.value.startswith(f"{tag}-".encode())]
        assert_exactly_once_in_order(sent, mine)
    assert sum(hi - lo for lo, hi in marks.values()) == expect, marks


def _leaders(partition: int) -> int:
    return NODES[partition % len(NODES)]


@pytest.mark.parametrize("client", CLIENTS)
def test_produce_coalesces_per_leader(
    client: str, stack: ClusterStack, request: pytest.FixtureRequest
) -> None:
    topic = fresh_topic(stack.bootstrap, "coalesce", PARTITIONS, request)
    # p0 writes partitions 0-2, p1 3-5, p2 all: every node's two partitions are written by two
    # producers at once, so their batches always have a chance to meet on the node's lane.
    sends = {
        "p0": make_messages(150, 3, tag="p0"),
        "p1": [m._replace(partition=m.partition + 3) for m in make_messages(150, 3, tag="p1")],
        "p2": make_messages(150, PARTITIONS, tag="p2"),
    }
    before, asked = stack.cluster.records(), stack.client_requests("Produce")
    produce_concurrently(client, stack.bootstrap, topic, sends, pause=0.01)
    asked = stack.client_requests("Produce") - asked
    traffic = topic_traffic(before, stack.cluster.records(), topic)

    assert sum(traffic.refused.values()) == 0, f"batches sent to a non-leader: {traffic}"
    assert traffic.partitions == {
        n: {p for p in range(PARTITIONS) if _leaders(p) == n} for n in NODES
    }, traffic
    if not ONE_TO_ONE:
        assert traffic.total_requests() < asked, f"no coalescing: {asked} in, {traffic}"
        if IDEMPOTENT[client]:  # producer ids tell the producers apart
            assert all(traffic.producers_per_request.get(n, 0) >= 2 for n in NODES), traffic
    _check_received(sends, stack.bootstrap, topic)


@pytest.mark.parametrize("client", CLIENTS)
def test_produce_through_leader_moves(
    client: str, stack: ClusterStack, request: pytest.FixtureRequest
) -> None:
    topic = fresh_topic(stack.bootstrap, "moves", PARTITIONS, request)
    sends = {f"m{i}": make_messages(300, PARTITIONS, tag=f"m{i}") for i in range(2)}
    before = stack.cluster.records()
    with Mover(stack.cluster, topic) as mover:
        produce_concurrently(client, stack.bootstrap, topic, sends, pause=0.05)
    traffic = topic_traffic(before, stack.cluster.records(), topic)

    assert mover.moves >= 3, mover.moves
    assert not mover.bypassed, f"clients connected to nodes directly: {mover.bypassed}"
    assert sum(traffic.refused.values()) > 0, f"no move hit the traffic: {traffic}"
    _check_received(sends, stack.bootstrap, topic)


# --------------------------------------------------------------------------- raw answers


def _produce(address: tuple[str, int], topic: str, partitions: list[int]) -> ProduceResponseData:
    """One Produce v11 (acks=all), one small batch per partition, on a new connection."""
    version = 11
    now = int(time.time() * 1000)
    batches = [
        PartitionBatch(
            topic, p, memoryview(encode_batch([Record(b"k", b"raw")], base_timestamp=now))
        )
        for p in partitions
    ]
    body = b"".join(
        bytes(c)
        for c in encode_produce_request(version, acks=-1, timeout_ms=5000, partitions=batches)
    )
    header = encode_request_header(ApiKey.PRODUCE, version, 7, "kipside-it-raw")
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(len(header + body).to_bytes(4, "big") + header + body)
        frame = read_frame(sock)
    offset = parse_response_header(frame, ApiKey.PRODUCE, version).body_offset
    return parse_produce_response(frame, offset, version)


def check_not_leader_answer(stack: ClusterStack, topic: str, path: str) -> int:
    """kipside's node 1 listener answers a Produce naming partition 0 (led by node 1) and 2
    (led by node 3) as the simulated node 1 itself does, node 3's endpoint pointing at kipside.
    `path` is how kipside must carry it: "coalesced" (a request kipside wrote) or
    "pass-through" (the client's own frame: a first request dials node 1's lane, the second
    finds it idle). Returns how many records it wrote to partition 0."""
    cluster, ks = stack.cluster, stack.kipside
    node1 = ("127.0.0.1", ks.node_ports[1])
    direct = _produce(("127.0.0.1", cluster.port(1)), topic, [0, 2])
    _produce(node1, topic, [0, 2])  # node 1's lane is up
    if path == "pass-through":
        via = _produce(node1, topic, [0, 2])  # on the idle lane, as the client wrote it
    else:
        # Another client's request in flight on node 1's one lane: this one waits for the
        # lane's next request, which kipside writes (this module's rules: linger 5 ms).
        with ThreadPoolExecutor(2) as pool:
            cluster.hold(1)
            try:
                ahead = pool.submit(_produce, node1, topic, [0])
                time.sleep(0.3)
                behind = pool.submit(_produce, node1, topic, [0, 2])
                time.sleep(0.3)
            finally:
                cluster.release(1)
            via, _ = behind.result(30), ahead.result(30)
    upstream = cluster.record(1).produce[-1]
    assert upstream.client_id == ("kipside-it-raw" if path == "pass-through" else "kipside")
    assert upstream.refused == ((topic, 2),), upstream
    leader, epoch = cluster.leader(topic, 2)
    for answer, node3 in ((direct, cluster.port(3)), (via, ks.node_ports[3])):
        ok, refused = answer.partitions
        assert (ok.partition, ok.error_code) == (0, 0) and ok.base_offset >= 0, answer
        assert (refused.partition, refused.error_code) == (2, NOT_LEADER), answer
        assert refused.current_leader == (leader, epoch) == (3, epoch), answer
        assert [(e.node_id, e.host, e.port) for e in answer.node_endpoints] == [
            (3, "127.0.0.1", node3)
        ], answer
    return 3 if path == "pass-through" else 4


def test_not_leader_answer_is_the_brokers(
    stack: ClusterStack, request: pytest.FixtureRequest
) -> None:
    topic = fresh_topic(stack.bootstrap, "raw", PARTITIONS, request)
    check_not_leader_answer(stack, topic, "coalesced")  # this module's kipside lingers


# --------------------------------------------------------------------------- nodes come and go


def test_nodes_join_and_leave_mid_traffic(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if DIRECT:
        pytest.skip("KIPSIDE_TEST_DIRECT=1: these tests are about kipside in front of a cluster")
    with cluster_stack(tmp_path / "nodes") as stack:
        cluster, ks = stack.cluster, stack.kipside
        topic = fresh_topic(stack.bootstrap, "nodes", PARTITIONS, request)
        raw = check_not_leader_answer(stack, topic, "pass-through")  # linger 0 here
        before = cluster.records()
        base = ks.node_ports[1] - 1
        sends = {f"n{i}": make_messages(400, PARTITIONS, tag=f"n{i}") for i in range(2)}
        with Mover(cluster, topic, interval=0.2) as mover:
            producing = Background(
                lambda: produce_concurrently(
                    "confluent-kafka", stack.bootstrap, topic, sends, pause=0.05
                )
            )
            time.sleep(0.4)
            cluster.add_node(4)
            for partition in (0, 1):
                cluster.move_leader(topic, partition, 4)
            time.sleep(0.4)
            cluster.remove_node(3)
            assert producing.running(), "the traffic ended before node 3 left: too little of it"
            producing.join()
        assert mover.moves >= 4, mover.moves
        assert not mover.bypassed, f"clients connected to nodes directly: {mover.bypassed}"
        after = cluster.records()
        traffic = topic_traffic(before, after, topic)
        assert 4 in traffic.partitions, traffic  # node 4 took traffic once it led
        assert after[3].connections.cut > 0  # kipside's connections to node 3 were reset

        # kipside learned node 4 from Metadata and serves it on its deterministic port.
        listening_4 = f"kipside: node 4 listening on 127.0.0.1:{base + 4} -> upstream "
        assert listening_4 in ks.stdout_path.read_text()
        # Metadata (any client's) no longer lists node 3: kipside says so, keeps its port.
        AdminClient({"bootstrap.servers": stack.bootstrap}).list_topics(timeout=10)
        left = re.compile(r"upstream node 3 \(.*\) left the cluster")
        assert ks.wait_for_log(left.search), ks.log()[-3000:]
        mark = ks.log_mark()
        with socket.create_connection(("127.0.0.1", ks.node_ports[3]), timeout=5) as sock:
            sock.settimeout(5)
            with contextlib.suppress(ConnectionResetError):  # a reset is as good as a close
                assert sock.recv(1) == b"", "kipside kept a connection to a gone node open"
        assert ks.wait_for_log(
            lambda line: "dialled the listener of node 3, which has left the cluster" in line,
            mark,
        ), ks.log_since(mark)

        _check_received(sends, stack.bootstrap, topic, raw)
