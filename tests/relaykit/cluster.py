"""SIMULATION of a multi-broker Apache Kafka cluster: ONE Tansu presented as several nodes.

Tansu is one node (id 111) that serves every partition on every connection. Production Kafka
has several brokers, each leading some partitions and coordinating some groups and
transactional ids, and leaders move. `SimulatedCluster` puts one relay port per fake node id
(1, 2, 3, ...) in front of the same Tansu. Each port is a `SimulatedNode`, a filter on the
shared relay base (relaykit.base.Relay), and the nodes share one state:

- partition -> (leader node, leader epoch): partition P of every topic starts on the
  (P mod N)-th live node, at epoch 0 (Tansu's own);
- (key type, key) -> the coordinator node of a group or transactional id (by CRC-32).

It rewrites, so that clients see that cluster: Metadata (brokers = the live nodes' ports, the
controller, and per partition the leader, leader epoch, replicas and ISR = every live node,
leader first), FindCoordinator (v0-3 top level, v4+ each coordinator) and DescribeCluster.

It enforces what Apache Kafka enforces:
- Produce, Fetch and ListOffsets: a partition sent to a node that does not lead it gets
  NOT_LEADER_OR_FOLLOWER; a Fetch or ListOffsets naming an older leader epoch gets
  FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH (checked first, as ReplicaManager
  does). Refusals name the current leader, and its endpoint where the version has endpoints
  (KIP-951). A request mixing served and refused partitions has only the served ones forwarded
  and both merged into one answer in request order; an acks=0 produce with a refused
  partition is not forwarded at all and its connection is closed (Kafka sends no answer to
  acks=0, and closes the connection on an error);
- JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, TxnOffsetCommit
  (group coordinator) and InitProducerId with a transactional id, AddPartitionsToTxn,
  AddOffsetsToTxn, EndTxn (transaction coordinator) sent to any other node get
  NOT_COORDINATOR, and never reach Tansu.

Tansu checks no leader epoch in requests (it reports 0; seen here with Fetch and ListOffsets
naming epoch 5), so the epochs bumped here are checked here only. Tansu offers no
OffsetForLeaderEpoch, so clients never validate their positions against them.

Commands (test thread): move_leader, move_coordinator, add_node, remove_node (the node leaves
Metadata, its leaders and coordinators move to live nodes with new epochs, its port resets
every connection and accepts no more), advertise (answers name another port for a node: a
front relay's, such as the TLS and SASL listeners of relaykit.secure). Records (test
thread): per node, requests by API, refusals, every ProduceRequest's forwarded batches and
refused partitions, connections.

Not simulated: replication (all nodes share the one Tansu log, so a move loses nothing),
fetch sessions (Tansu has none), OffsetForLeaderEpoch, DescribeTopicPartitions.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Self

from relays import BatchSeen, produce_batches
from testkit.broker import Broker, start_tansu

from kipside.protocol import blank, field_entity
from kipside.protocol.apis import ApiKey
from kipside.protocol.headers import build_frame, parse_response_header
from kipside.protocol.messages import Message, decode_request, decode_response, encode_message

from .base import LOOPBACK, LinkCounts, Relay, response_frame
from .decisions import CLOSE, FORWARD, Answer, Conn, Decision, Forward, Request
from .kafka_answers import (
    FENCED_LEADER_EPOCH,
    GROUP,
    GROUP_COORDINATED,
    NOT_COORDINATOR,
    NOT_LEADER,
    PARTITIONED,
    TRANSACTION_COORDINATED,
    UNKNOWN_LEADER_EPOCH,
    Refusal,
    TopicKey,
    coordinator_key,
    keep_partitions,
    merged_answer,
    not_coordinator_answer,
    replace_known,
    request_partitions,
)

TopicPartition = tuple[str, int]
_REWRITTEN = frozenset({ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER})
_COORDINATED = GROUP_COORDINATED | TRANSACTION_COORDINATED


@dataclass(frozen=True, slots=True)
class ProduceSeen:
    """One ProduceRequest a node received."""

    connection: int  # the node's connection number (relaykit.base.Conn.number)
    client_id: str  # from the request header ("kipside" for requests kipside wrote itself)
    acks: int
    batches: tuple[BatchSeen, ...]  # forwarded to the broker, in request order
    refused: tuple[TopicPartition, ...]  # answered with an error by the node itself


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What one node saw, copied at one moment."""

    node: int
    requests: Counter[int]  # by API key, as received
    refused: Counter[tuple[int, int]]  # (API key, error code) -> partitions or requests
    produce: tuple[ProduceSeen, ...]
    connections: LinkCounts

    def batches(self) -> list[BatchSeen]:
        """Every record batch the node forwarded to the broker, in order."""
        return [b for seen in self.produce for b in seen.batches]


class SimulatedCluster:
    """SIMULATION: one Tansu presented as a cluster of broker nodes (the module docstring).

    Usage: `with simulated_cluster() as cluster:`; clients (or kipside) bootstrap from
    `cluster.bootstrap`. Every public method is called from the test's thread.
    """

    def __init__(self, node_ids: Sequence[int] = (1, 2, 3)) -> None:
        self._lock = threading.RLock()
        self.broker: Broker | None = None
        self._upstream: tuple[str, int] | None = None
        self._live = {node_id: SimulatedNode(self, node_id) for node_id in node_ids}
        self._removed: dict[int, SimulatedNode] = {}
        self._advertised: dict[int, int] = {}  # node id -> the port answers name (a front's)
        self._leaders: dict[TopicPartition, tuple[int, int]] = {}
        self._coordinators: dict[tuple[int, str], int] = {}
        self._topic_ids: dict[uuid.UUID, str] = {}

    # Control (test thread) ---------------------------------------------------------------

    def start(self) -> Self:
        for node in self._live.values():
            node.start()
        return self

    def close(self) -> None:
        for node in [*self._live.values(), *self._removed.values()]:
            node.close()

    @property
    def upstream(self) -> tuple[str, int] | None:
        return self._upstream

    @upstream.setter
    def upstream(self, address: tuple[str, int]) -> None:
        with self._lock:
            self._upstream = address
            for node in self._live.values():
                node.upstream = address

    @property
    def bootstrap(self) -> str:
        """Every live node's address as answers name it (see advertise), comma-separated."""
        with self._lock:
            return ",".join(f"{LOOPBACK}:{self._advertised_port(n)}" for n in sorted(self._live))

    def nodes(self) -> list[int]:
        with self._lock:
            return sorted(self._live)

    def hold(self, node_id: int) -> None:
        """Requests to node `node_id` stay in flight at its relay until `release`."""
        self._node(node_id).hold()

    def release(self, node_id: int) -> None:
        self._node(node_id).release()

    def port(self, node_id: int) -> int:
        with self._lock:
            return self._node(node_id).port

    def advertise(self, node_id: int, port: int) -> None:
        """Name 127.0.0.1:`port` as the node's address in every answer (Metadata,
        FindCoordinator, DescribeCluster, KIP-951 endpoints) instead of the node's own port: a
        front that forwards to the node's port (a TLS and SASL listener, relaykit.secure)
        then carries every connection a client makes to that node."""
        with self._lock:
            self._node(node_id)
            self._advertised[node_id] = port

    def leader(self, topic: str, partition: int) -> tuple[int, int]:
        """(leader node, leader epoch) of a partition."""
        with self._lock:
            return self._leader((topic, partition))

    def coordinator(self, key_type: int, key: str) -> int:
        """The coordinator node of a group (key type 0) or transactional id (1)."""
        with self._lock:
            return self._coordinator(key_type, key)

    def move_leader(self, topic: str, partition: int, node_id: int) -> int:
        """Elect `node_id` leader of the partition (Apache Kafka bumps the leader epoch on every
        election); returns the new epoch. The old leader refuses the partition from now on."""
        with self._lock:
            self._require_live(node_id)
            _, epoch = self._leader((topic, partition))
            self._leaders[(topic, partition)] = (node_id, epoch + 1)
            return epoch + 1

    def move_coordinator(self, key_type: int, key: str, node_id: int) -> None:
        with self._lock:
            self._require_live(node_id)
            self._coordinators[(key_type, key)] = node_id

    def add_node(self, node_id: int) -> None:
        """A broker joins: it leads nothing until a leader is moved to it."""
        with self._lock:
            if node_id in self._live or node_id in self._removed:
                raise ValueError(f"node {node_id} exists or existed")
            node = SimulatedNode(self, node_id)
            node.upstream = self._upstream
        node.start()
        with self._lock:
            self._live[node_id] = node

    def remove_node(self, node_id: int) -> int:
        """A broker leaves for good: it vanishes from Metadata, its partitions and coordinators
        move to the live nodes (new epochs), its connections are reset and its port closed.
        Returns how many connections were reset."""
        with self._lock:
            self._require_live(node_id)
            node = self._live.pop(node_id)
            self._removed[node_id] = node
            live = sorted(self._live)
            for tp, (leader, epoch) in self._leaders.items():
                if leader == node_id:
                    self._leaders[tp] = (live[tp[1] % len(live)], epoch + 1)
            for key, coordinator in self._coordinators.items():
                if coordinator == node_id:
                    self._coordinators[key] = live[zlib.crc32(key[1].encode()) % len(live)]
        reset = node.cut_all()
        node.close()
        return reset

    def record(self, node_id: int) -> NodeRecord:
        with self._lock:
            node = self._live.get(node_id) or self._removed[node_id]
        return node.record()

    def records(self) -> dict[int, NodeRecord]:
        with self._lock:
            ids = sorted({*self._live, *self._removed})
        return {n: self.record(n) for n in ids}

    def problems(self) -> list[str]:
        with self._lock:
            nodes = [*self._live.values(), *self._removed.values()]
        return [f"node {n.node_id}: {p}" for n in nodes for p in n.problems()]

    # State (any node's thread; the lock held) ----------------------------------------------

    def _require_live(self, node_id: int) -> None:
        if node_id not in self._live:
            raise ValueError(f"node {node_id} is not live (live: {sorted(self._live)})")

    def _node(self, node_id: int) -> SimulatedNode:
        node = self._live.get(node_id) or self._removed.get(node_id)
        if node is None:
            raise ValueError(f"no node {node_id}")
        return node

    def _advertised_port(self, node_id: int) -> int:
        return self._advertised.get(node_id) or self._node(node_id).port

    def _leader(self, tp: TopicPartition) -> tuple[int, int]:
        found = self._leaders.get(tp)
        if found is None:
            live = sorted(self._live)
            found = self._leaders[tp] = (live[tp[1] % len(live)], 0)
        return found

    def _coordinator(self, key_type: int, key: str) -> int:
        found = self._coordinators.get((key_type, key))
        if found is None:
            live = sorted(self._live)
            found = self._coordinators[(key_type, key)] = live[zlib.crc32(key.encode()) % len(live)]
        return found

    def refusals(
        self, node_id: int, named: list[tuple[TopicKey, int, int]]
    ) -> dict[tuple[TopicKey, int], Refusal]:
        """The partitions of a request that `node_id` must refuse, and why."""
        out: dict[tuple[TopicKey, int], Refusal] = {}
        with self._lock:
            for key, partition, epoch in named:
                topic = key if isinstance(key, str) else self._topic_ids.get(key)
                if topic is None:
                    continue  # a topic id no Metadata named: the broker answers for it
                leader, current = self._leader((topic, partition))
                if epoch >= 0 and epoch != current:
                    code = FENCED_LEADER_EPOCH if epoch < current else UNKNOWN_LEADER_EPOCH
                elif leader != node_id:
                    code = NOT_LEADER
                else:
                    continue
                port = self._advertised_port(leader)
                out[(key, partition)] = Refusal(code, leader, current, LOOPBACK, port)
        return out

    def _live_brokers(self, answer: Message, id_field: str) -> tuple[list[int], tuple[Any, ...]]:
        """The live node ids, and `answer`'s broker entries naming them (Metadata calls the id
        node_id, DescribeCluster broker_id). The caller holds the lock."""
        broker_cls = field_entity(type(answer), "brokers")
        live = sorted(self._live)
        brokers = tuple(
            blank(
                broker_cls, host=LOOPBACK, port=self._advertised_port(n), rack=None, **{id_field: n}
            )
            for n in live
        )
        return live, brokers

    def metadata_answer(self, answer: Message) -> Message:
        with self._lock:
            live, brokers = self._live_brokers(answer, "node_id")
            topics = []
            for topic in answer.topics:
                if getattr(topic, "topic_id", None) is not None and topic.name is not None:
                    self._topic_ids[topic.topic_id] = topic.name
                if topic.error_code != 0 or topic.name is None:
                    topics.append(topic)
                    continue
                partitions = []
                for p in topic.partitions:
                    leader, epoch = self._leader((topic.name, int(p.partition_index)))
                    replicas = (leader, *(n for n in live if n != leader))
                    partitions.append(
                        replace_known(
                            p,
                            leader_id=leader,
                            leader_epoch=epoch,
                            replica_nodes=replicas,
                            isr_nodes=replicas,
                            offline_replicas=(),
                        )
                    )
                topics.append(dataclasses.replace(topic, partitions=tuple(partitions)))
        return replace_known(answer, brokers=brokers, controller_id=live[0], topics=tuple(topics))

    def find_coordinator_answer(self, request: Message, answer: Message) -> Message:
        with self._lock:
            if hasattr(answer, "coordinators"):
                entries = tuple(
                    self._coordinator_entry(c, int(request.key_type), str(c.key))
                    for c in answer.coordinators
                )
                return dataclasses.replace(answer, coordinators=entries)
            key_type = int(getattr(request, "key_type", GROUP))
            return self._coordinator_entry(answer, key_type, str(request.key))

    def _coordinator_entry(self, entry: Any, key_type: int, key: str) -> Any:
        if entry.error_code != 0:
            return entry
        node = self._coordinator(key_type, key)
        port = self._advertised_port(node)
        return replace_known(entry, node_id=node, host=LOOPBACK, port=port)

    def describe_cluster_answer(self, answer: Message) -> Message:
        with self._lock:
            live, brokers = self._live_brokers(answer, "broker_id")
        return dataclasses.replace(answer, brokers=brokers, controller_id=live[0])


class SimulatedNode(Relay):
    """One fake broker node of a SimulatedCluster: its port, as a filter on the relay base."""

    def __init__(self, cluster: SimulatedCluster, node_id: int) -> None:
        super().__init__()
        self.cluster = cluster
        self.node_id = node_id
        self._requests: Counter[int] = Counter()
        self._refused: Counter[tuple[int, int]] = Counter()
        self._produce: list[ProduceSeen] = []
        # Requests forwarded in part: (connection, correlation id) -> (request, refusals).
        self._split: dict[tuple[int, int], tuple[Message, dict[tuple[TopicKey, int], Refusal]]]
        self._split = {}

    def record(self) -> NodeRecord:
        with self._lock:
            return NodeRecord(
                self.node_id,
                Counter(self._requests),
                Counter(self._refused),
                tuple(self._produce),
                self.link_counts(),
            )

    # Hooks (this node's trio thread) -----------------------------------------------------

    def on_request(self, conn: Conn, request: Request) -> Decision:
        h = request.header
        with self._lock:
            self._requests[h.api_key] += 1
        if h.api_key in PARTITIONED:
            return self._led_only(conn, request)
        if h.api_key in _COORDINATED:
            return self._coordinated_only(request)
        return FORWARD

    def on_response(self, conn: Conn, request: Request, frame: bytes) -> bytes | None:
        h = request.header
        split = self._split.pop((conn.number, h.correlation_id), None)
        if split is None and h.api_key not in _REWRITTEN:
            return frame
        offset = parse_response_header(frame, h.api_key, h.api_version).body_offset
        answer = decode_response(h.api_key, h.api_version, frame, offset)
        if split is not None:
            answer = merged_answer(h.api_key, h.api_version, split[0], answer, split[1])
        elif h.api_key == ApiKey.METADATA:
            answer = self.cluster.metadata_answer(answer)
        elif h.api_key == ApiKey.DESCRIBE_CLUSTER:
            answer = self.cluster.describe_cluster_answer(answer)
        else:
            asked = decode_request(h.api_key, h.api_version, request.frame, h.body_offset)
            answer = self.cluster.find_coordinator_answer(asked, answer)
        return response_frame(h, encode_message(answer))

    def _led_only(self, conn: Conn, request: Request) -> Decision:
        """Forward the partitions this node leads; refuse the others as Kafka does."""
        h = request.header
        message = decode_request(h.api_key, h.api_version, request.frame, h.body_offset)
        named = list(request_partitions(h.api_key, message))
        refused = self.cluster.refusals(self.node_id, named)
        with self._lock:
            for refusal in refused.values():
                self._refused[(h.api_key, refusal.error_code)] += 1
            if h.api_key == ApiKey.PRODUCE:
                # v0-2 carry legacy message sets, not record batches: none recorded
                every = produce_batches(request.frame) if h.api_version >= 3 else []
                batches = tuple(b for b in every if (b.topic, b.partition) not in refused)
                keys = tuple((str(k), p) for k, p in refused)
                client_id = h.client_id or ""
                seen = ProduceSeen(conn.number, client_id, int(message.acks), batches, keys)
                self._produce.append(seen)
        if not refused:
            return FORWARD
        if h.api_key == ApiKey.PRODUCE and message.acks == 0:
            return CLOSE
        keep = {(key, partition) for key, partition, _ in named} - set(refused)
        if not keep:
            answer = merged_answer(h.api_key, h.api_version, message, None, refused)
            return Answer(response_frame(h, encode_message(answer)))
        self._split[(conn.number, h.correlation_id)] = (message, refused)
        body = encode_message(keep_partitions(h.api_key, message, keep))
        return Forward(build_frame(request.frame[4 : h.body_offset], body))

    def _coordinated_only(self, request: Request) -> Decision:
        """Forward a group or transaction request only on its coordinator."""
        h = request.header
        message = decode_request(h.api_key, h.api_version, request.frame, h.body_offset)
        key = coordinator_key(h.api_key, message)
        if key is None or self.cluster.coordinator(*key) == self.node_id:
            return FORWARD
        with self._lock:
            self._refused[(h.api_key, NOT_COORDINATOR)] += 1
        answer = not_coordinator_answer(h.api_key, h.api_version, message)
        return Answer(response_frame(h, encode_message(answer)))


@contextmanager
def simulated_cluster(node_ids: Sequence[int] = (1, 2, 3)) -> Iterator[SimulatedCluster]:
    """A SimulatedCluster of `node_ids` in front of a fresh in-memory Tansu (which advertises
    the first node's port, so no address of its own ever reaches a client); both stop on exit."""
    cluster = SimulatedCluster(node_ids).start()
    try:
        broker = start_tansu(advertised_port=cluster.port(min(node_ids)))
        cluster.broker = broker
        cluster.upstream = (LOOPBACK, broker.port)
        with broker:
            yield cluster
    finally:
        cluster.close()
