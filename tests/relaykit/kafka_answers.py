"""Kafka's own error answers, built from the request they answer (kio, through kipside.protocol's
messages adapter), for relays that stand in for a broker's refusals.

- Built with kipside.protocol's `blank` (a kio entity with every unset field at Kafka's
  "unknown") and `field_entity`, as kipside builds its own answers.
- Partition-led requests (Produce, Fetch, ListOffsets), described by `PARTITIONED`: which
  partitions a request names (`request_partitions`), the request cut down to some of them
  (`keep_partitions`), and the answer with the refused ones merged back in request order
  (`merged_answer`), the way one broker answers a request of which it leads only part.
- Coordinator requests: `coordinator_key` (which group or transactional id a request is for)
  and `not_coordinator_answer` (NOT_COORDINATOR for everything it asked, in its own shape).

Pure functions over decoded messages: no sockets, no state.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from kipside.protocol import blank, field_entity
from kipside.protocol.apis import ApiKey
from kipside.protocol.kafka_errors import ErrorCode
from kipside.protocol.messages import Message, response_class

NOT_LEADER: Final = int(ErrorCode.not_leader_or_follower)
NOT_COORDINATOR: Final = int(ErrorCode.not_coordinator)
FENCED_LEADER_EPOCH: Final = int(ErrorCode.fenced_leader_epoch)
UNKNOWN_LEADER_EPOCH: Final = int(ErrorCode.unknown_leader_epoch)

GROUP: Final = 0  # FindCoordinator key types
TRANSACTION: Final = 1

TopicKey = str | uuid.UUID  # a topic as a request names it: by name, or by id (Fetch v13+)


# --------------------------------------------------------------------------- entities


def replace_known(entity: Any, **changes: Any) -> Any:
    """dataclasses.replace with only the fields this entity's version has."""
    names = {f.name for f in dataclasses.fields(entity)}
    return dataclasses.replace(entity, **{k: v for k, v in changes.items() if k in names})


# --------------------------------------------------------------------------- partition-led APIs


@dataclass(frozen=True, slots=True)
class Partitioned:
    """Where a partition-led API keeps its topics and partitions, in requests and answers."""

    request_topics: str
    request_partitions: str
    request_index: str
    response_topics: str
    response_partitions: str
    response_index: str
    epoch_checked: bool  # Apache Kafka checks the request's current_leader_epoch


PARTITIONED: Final[dict[int, Partitioned]] = {
    ApiKey.PRODUCE: Partitioned(
        "topic_data", "partition_data", "index", "responses", "partition_responses", "index", False
    ),
    ApiKey.FETCH: Partitioned(
        "topics", "partitions", "partition", "responses", "partitions", "partition_index", True
    ),
    ApiKey.LIST_OFFSETS: Partitioned(
        "topics", "partitions", "partition_index", "topics", "partitions", "partition_index", True
    ),
}


def topic_key(topic: Any) -> tuple[str, TopicKey]:
    """(field, value) naming a request's or answer's topic entry: name, topic or topic_id."""
    for name in ("name", "topic", "topic_id"):
        if hasattr(topic, name):
            return name, getattr(topic, name)
    raise TypeError(f"{type(topic).__name__} names no topic")


def request_partitions(api_key: int, request: Message) -> Iterator[tuple[TopicKey, int, int]]:
    """(topic, partition, current leader epoch or -1) for each partition a request names."""
    spec = PARTITIONED[api_key]
    for topic in getattr(request, spec.request_topics):
        _, key = topic_key(topic)
        for p in getattr(topic, spec.request_partitions):
            epoch = getattr(p, "current_leader_epoch", -1) if spec.epoch_checked else -1
            yield key, int(getattr(p, spec.request_index)), int(epoch)


def keep_partitions(api_key: int, request: Message, keep: set[tuple[TopicKey, int]]) -> Message:
    """The request naming only the partitions in `keep` (topics left empty are dropped). A
    Fetch that lost partitions waits at most 1 ms: their errors must come back at once (not 0:
    Tansu 0.6.0 answers a Fetch with max_wait 0 with no partitions at all, seen here)."""
    spec = PARTITIONED[api_key]
    topics = []
    for topic in getattr(request, spec.request_topics):
        _, key = topic_key(topic)
        kept = tuple(
            p
            for p in getattr(topic, spec.request_partitions)
            if (key, int(getattr(p, spec.request_index))) in keep
        )
        if kept:
            topics.append(dataclasses.replace(topic, **{spec.request_partitions: kept}))
    changes: dict[str, Any] = {spec.request_topics: tuple(topics)}
    if api_key == ApiKey.FETCH:
        changes["max_wait"] = min(request.max_wait, datetime.timedelta(milliseconds=1))
    return dataclasses.replace(request, **changes)


@dataclass(frozen=True, slots=True)
class Refusal:
    """One partition a node would not serve, and the leader it points to."""

    error_code: int
    leader: int
    leader_epoch: int
    leader_host: str
    leader_port: int


def merged_answer(
    api_key: int,
    api_version: int,
    request: Message,
    answer: Message | None,
    refused: dict[tuple[TopicKey, int], Refusal],
) -> Message:
    """The answer to `request`: the broker's `answer` (to the partitions it was sent; None if
    it was sent none) with each refused partition's error, every partition in request order.
    Refusals name the current leader, and its endpoint where the version carries endpoints
    (KIP-951: Produce v10+, Fetch v16+)."""
    spec = PARTITIONED[api_key]
    cls = response_class(api_key, api_version)
    topic_cls = field_entity(cls, spec.response_topics)
    partition_cls = field_entity(topic_cls, spec.response_partitions)
    base = answer if answer is not None else blank(cls)
    got = {
        (topic_key(t)[1], int(getattr(p, spec.response_index))): p
        for t in getattr(base, spec.response_topics)
        for p in getattr(t, spec.response_partitions)
    }
    leader_cls = None
    if "current_leader" in {f.name for f in dataclasses.fields(partition_cls)}:
        leader_cls = field_entity(partition_cls, "current_leader")
    topics = []
    for topic in getattr(request, spec.request_topics):
        key_field, key = topic_key(topic)
        entries = []
        for p in getattr(topic, spec.request_partitions):
            index = int(getattr(p, spec.request_index))
            refusal = refused.get((key, index))
            if refusal is None:
                if (key, index) in got:
                    entries.append(got[(key, index)])
                continue
            values: dict[str, Any] = {spec.response_index: index, "error_code": refusal.error_code}
            if leader_cls is not None:
                values["current_leader"] = blank(
                    leader_cls, leader_id=refusal.leader, leader_epoch=refusal.leader_epoch
                )
            entries.append(blank(partition_cls, **values))
        if entries:
            topics.append(blank(topic_cls, **{key_field: key, spec.response_partitions: entries}))
    changes: dict[str, Any] = {spec.response_topics: tuple(topics)}
    if hasattr(base, "node_endpoints") and refused:
        endpoint_cls = field_entity(cls, "node_endpoints")
        endpoints = {int(e.node_id): e for e in base.node_endpoints}
        for r in refused.values():
            endpoints[r.leader] = blank(
                endpoint_cls, node_id=r.leader, host=r.leader_host, port=r.leader_port, rack=None
            )
        changes["node_endpoints"] = tuple(endpoints[n] for n in sorted(endpoints))
    return dataclasses.replace(base, **changes)


# --------------------------------------------------------------------------- coordinators

GROUP_COORDINATED: Final = frozenset(
    {
        ApiKey.JOIN_GROUP,
        ApiKey.SYNC_GROUP,
        ApiKey.HEARTBEAT,
        ApiKey.LEAVE_GROUP,
        ApiKey.OFFSET_COMMIT,
        ApiKey.OFFSET_FETCH,
        ApiKey.TXN_OFFSET_COMMIT,  # goes to the group's coordinator, not the transaction's
    }
)
TRANSACTION_COORDINATED: Final = frozenset(
    {
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.ADD_PARTITIONS_TO_TXN,
        ApiKey.ADD_OFFSETS_TO_TXN,
        ApiKey.END_TXN,
    }
)


def coordinator_key(api_key: int, request: Message) -> tuple[int, str] | None:
    """(key type, key) of the coordinator a request must reach; None if any broker serves it
    (InitProducerId without a transactional id)."""
    if api_key == ApiKey.OFFSET_FETCH and hasattr(request, "groups"):
        return (GROUP, str(request.groups[0].group_id)) if request.groups else None
    if api_key in GROUP_COORDINATED:
        return GROUP, str(request.group_id)
    if api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
        if hasattr(request, "v3_and_below_transactional_id"):
            return TRANSACTION, str(request.v3_and_below_transactional_id)
        txns = request.transactions
        return (TRANSACTION, str(txns[0].transactional_id)) if txns else None
    if api_key in TRANSACTION_COORDINATED:
        txn_id = request.transactional_id
        return None if txn_id is None else (TRANSACTION, str(txn_id))
    return None


def _per_partition(
    cls: Any, field: str, topics: Any, error_field: str, **extra: Any
) -> tuple[Any, ...]:
    """The answer's topics for request `topics`, each partition with NOT_COORDINATOR."""
    topic_cls = field_entity(cls, field)
    partitions_field = next(
        f.name for f in dataclasses.fields(topic_cls) if f.name not in ("name", "topic")
    )
    partition_cls = field_entity(topic_cls, partitions_field)
    out = []
    for topic in topics or ():
        indexes = getattr(topic, "partition_indexes", None)
        if indexes is None:
            indexes = topic.partitions
        entries = tuple(
            blank(
                partition_cls,
                partition_index=int(getattr(p, "partition_index", p)),
                **{error_field: NOT_COORDINATOR},
                **extra,
            )
            for p in indexes
        )
        out.append(blank(topic_cls, name=topic.name, **{partitions_field: entries}))
    return tuple(out)


def not_coordinator_answer(api_key: int, api_version: int, request: Message) -> Message:
    """NOT_COORDINATOR for everything `request` asked, as Apache Kafka answers a group or
    transaction request sent to a broker that does not coordinate its group or id."""
    cls = response_class(api_key, api_version)
    if api_key in (ApiKey.OFFSET_COMMIT, ApiKey.TXN_OFFSET_COMMIT):
        return blank(cls, topics=_per_partition(cls, "topics", request.topics, "error_code"))
    if api_key == ApiKey.OFFSET_FETCH and hasattr(request, "groups"):
        group_cls = field_entity(cls, "groups")
        groups = tuple(
            blank(group_cls, group_id=g.group_id, topics=(), error_code=NOT_COORDINATOR)
            for g in request.groups
        )
        return blank(cls, groups=groups)
    if api_key == ApiKey.OFFSET_FETCH:
        topics = _per_partition(cls, "topics", request.topics, "error_code", metadata="")
        return blank(cls, topics=topics, error_code=NOT_COORDINATOR)
    if api_key == ApiKey.ADD_PARTITIONS_TO_TXN and hasattr(request, "v3_and_below_topics"):
        field = "results_by_topic_v3_and_below"
        topics = _per_partition(cls, field, request.v3_and_below_topics, "partition_error_code")
        return blank(cls, **{field: topics})
    return blank(cls, error_code=NOT_COORDINATOR)
