"""Topic and consumer-group operations the pipelines need: describe and create topics, add
partitions, read and commit a group's offsets. Each is one or two Kafka requests under the
client's retry policy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from kipside.protocol import (
    ApiKey,
    ErrorCode,
    VersionRange,
    build_request,
    encode_message,
    error_name,
)

from .client import KafkaClient, body_of, check_error
from .errors import BrokerError, RetriableError, TopicNotFound

__all__ = [
    "NewTopic",
    "commit_group_offsets",
    "committed_offsets",
    "create_partitions",
    "create_topics",
    "describe_topic_configs",
    "group_has_members",
    "group_offsets",
    "list_groups",
    "partition_counts",
]

TopicPartition = tuple[str, int]
DESCRIBE_CONFIGS: Final = VersionRange(1, 4)
CREATE_TOPICS: Final = VersionRange(2, 7)
CREATE_PARTITIONS: Final = VersionRange(0, 3)
OFFSET_FETCH: Final = VersionRange(1, 9)
_OFFSET_FETCH_BATCHED: Final = 8
OFFSET_COMMIT: Final = VersionRange(2, 8)
LIST_GROUPS: Final = VersionRange(0, 4)
DESCRIBE_GROUPS: Final = VersionRange(0, 5)
_NO_MEMBERS: Final = frozenset({"Empty", "Dead"})
_GROUP_NOT_FOUND: Final = int(ErrorCode.group_id_not_found)
_TOPIC_RESOURCE: Final = 2
_TOPIC_CONFIG_SOURCE: Final = 1  # DYNAMIC_TOPIC_CONFIG: set on the topic itself
_GROUP_KEY: Final = 0
_ALREADY_EXISTS: Final = int(ErrorCode.topic_already_exists)
_INVALID_PARTITIONS: Final = int(ErrorCode.invalid_partitions)


@dataclass(frozen=True, slots=True)
class NewTopic:
    name: str
    partitions: int
    configs: Mapping[str, str]


def partition_counts(client: KafkaClient, topics: Sequence[str]) -> dict[str, int]:
    """How many partitions each existing topic has; missing topics are left out."""
    meta = client.retrying("reading topic metadata", lambda: client.metadata(topics))
    return {
        name: len(info.partitions)
        for name, info in meta.topics.items()
        if info.error_code == 0 and info.partitions
    }


def describe_topic_configs(client: KafkaClient, topics: Sequence[str]) -> dict[str, dict[str, str]]:
    """The configs set on each topic itself (not broker defaults), sensitive ones left out."""

    resources = [
        {"resource_type": _TOPIC_RESOURCE, "resource_name": t, "configuration_keys": None}
        for t in topics
    ]
    fields = {"resources": resources, "include_synonyms": False, "include_documentation": False}
    body = body_of(ApiKey.DESCRIBE_CONFIGS, fields)

    def attempt() -> dict[str, dict[str, str]]:
        response = client.request(None, ApiKey.DESCRIBE_CONFIGS, DESCRIBE_CONFIGS, body).decode()
        out: dict[str, dict[str, str]] = {}
        for result in response.results:
            name = str(result.resource_name)
            check_error(int(result.error_code), f"DescribeConfigs for topic {name}", client.where)
            out[name] = {
                str(c.name): str(c.value)
                for c in result.configs
                if c.value is not None
                and not c.is_sensitive
                and int(getattr(c, "config_source", _TOPIC_CONFIG_SOURCE)) == _TOPIC_CONFIG_SOURCE
            }
        return out

    return client.retrying("describing topic configs", attempt)


def create_topics(
    client: KafkaClient, topics: Iterable[NewTopic], *, timeout_ms: int = 30_000
) -> None:
    """Create topics with the broker's default replication factor; existing ones are fine."""
    wanted = list(topics)
    if not wanted:
        return

    new_topics = [
        {
            "name": t.name,
            "num_partitions": t.partitions,
            "replication_factor": -1,
            "assignments": [],
            "configs": [{"name": k, "value": v} for k, v in t.configs.items()],
        }
        for t in wanted
    ]
    fields = {"topics": new_topics, "timeout": timeout_ms, "validate_only": False}
    body = body_of(ApiKey.CREATE_TOPICS, fields)

    def attempt() -> None:
        controller = client.metadata().controller
        node = controller if controller >= 0 else None
        response = client.request(node, ApiKey.CREATE_TOPICS, CREATE_TOPICS, body).decode()
        for result in response.topics:
            code = int(result.error_code)
            if code in (0, _ALREADY_EXISTS):
                continue
            detail = getattr(result, "error_message", None)
            text = f"CreateTopics for {result.name}: {client.where} answered {error_name(code)}" + (
                f" ({detail})" if detail else ""
            )
            if ErrorCode(code).retriable:
                raise RetriableError(text, code=code)
            raise BrokerError(
                text + ". Create the topic on the destination yourself, or fix the broker's "
                "topic policy",
                code=code,
            )

    client.retrying("creating topics", attempt)


def create_partitions(
    client: KafkaClient, counts: Mapping[str, int], *, timeout_ms: int = 30_000
) -> None:
    """Raise each topic's partition count to `counts[topic]` (CreatePartitions, KIP-195); a
    topic that has them already (another writer added them first) is fine."""
    topics = [{"name": t, "count": n, "assignments": None} for t, n in counts.items()]
    fields = {"topics": topics, "timeout": timeout_ms, "validate_only": False}
    body = body_of(ApiKey.CREATE_PARTITIONS, fields)

    def attempt() -> None:
        controller = client.metadata().controller
        node = controller if controller >= 0 else None
        response = client.request(node, ApiKey.CREATE_PARTITIONS, CREATE_PARTITIONS, body)
        for result in response.decode().results:
            code = int(result.error_code)
            if code == 0:
                continue
            if code == _INVALID_PARTITIONS:
                known = partition_counts(client, [str(result.name)]).get(str(result.name), 0)
                if known >= counts[str(result.name)]:
                    continue  # added meanwhile
            detail = f" ({result.error_message})" if result.error_message else ""
            text = (
                f"CreatePartitions for {result.name}: {client.where} answered "
                f"{error_name(code)}{detail}"
            )
            if ErrorCode(code).retriable:
                raise RetriableError(text, code=code)
            raise BrokerError(
                f"{text}. Add the partitions on the destination yourself (kafka-topics --alter "
                f"--topic {result.name} --partitions {counts[str(result.name)]})",
                code=code,
            )

    client.retrying("adding partitions", attempt)


def _coordinator(client: KafkaClient, group: str) -> int:
    return client.coordinator(group, _GROUP_KEY)


def committed_offsets(
    client: KafkaClient, group: str, partitions: Sequence[TopicPartition] | None = None
) -> dict[TopicPartition, int]:
    """The group's committed offsets (next offset to read) of `partitions` (None: every one it
    committed); partitions without one are left out. Offsets of transactions still open are
    waited for (require_stable), so an answer never shows what may yet be aborted.

    OffsetFetch v8+ asks in the batched form (one group here); older brokers get v1-7.
    """
    topics: list[dict[str, object]] | None = None
    if partitions is not None:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(partitions):
            by_topic.setdefault(topic, []).append(partition)
        topics = [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()]

    def body(version: int) -> bytes:
        fields: dict[str, object] = (
            {"groups": [{"group_id": group, "topics": topics}], "require_stable": True}
            if version >= _OFFSET_FETCH_BATCHED
            else {"group_id": group, "topics": topics, "require_stable": True}
        )
        return encode_message(build_request(ApiKey.OFFSET_FETCH, version, fields))

    def attempt() -> dict[TopicPartition, int]:
        node = _coordinator(client, group)
        response = client.request(node, ApiKey.OFFSET_FETCH, OFFSET_FETCH, body).decode()
        answer = response.groups[0] if hasattr(response, "groups") else response
        what = f"OffsetFetch for group {group!r}"
        check_error(int(getattr(answer, "error_code", 0)), what, client.where)
        out = {}
        for topic in answer.topics:
            for p in topic.partitions:
                check_error(
                    int(p.error_code), f"{what} on {topic.name}-{p.partition_index}", client.where
                )
                if int(p.committed_offset) >= 0:
                    out[(str(topic.name), int(p.partition_index))] = int(p.committed_offset)
        return out

    return client.retrying(f"reading the offsets of group {group!r}", attempt)


def group_offsets(client: KafkaClient, group: str) -> dict[TopicPartition, int]:
    """Every committed offset of the group; TopicNotFound if it has none."""
    offsets = committed_offsets(client, group)
    if not offsets:
        raise TopicNotFound(
            f"group {group!r} has no committed offsets in {client.where}: check the group name"
        )
    return offsets


def list_groups(client: KafkaClient) -> list[str]:
    """Every consumer group of the cluster (ListGroups, asked of each broker: a broker lists
    the groups it coordinates)."""
    body = body_of(ApiKey.LIST_GROUPS, {"states_filter": []})

    def attempt() -> list[str]:
        found: set[str] = set()
        for node in sorted(client.metadata().brokers):
            response = client.request(node, ApiKey.LIST_GROUPS, LIST_GROUPS, body).decode()
            check_error(int(response.error_code), "ListGroups", client.where)
            found.update(str(g.group_id) for g in response.groups)
        return sorted(found)

    return client.retrying("listing consumer groups", attempt)


def group_has_members(client: KafkaClient, group: str) -> bool:
    """Whether the group has active members (DescribeGroups: members, or a state other than
    Empty and Dead)."""
    fields = {"groups": [group], "include_authorized_operations": False}
    body = body_of(ApiKey.DESCRIBE_GROUPS, fields)

    def attempt() -> bool:
        node = _coordinator(client, group)
        response = client.request(node, ApiKey.DESCRIBE_GROUPS, DESCRIBE_GROUPS, body).decode()
        described = response.groups[0]
        if int(described.error_code) == _GROUP_NOT_FOUND:
            return False
        check_error(int(described.error_code), f"DescribeGroups {group!r}", client.where)
        state = str(described.group_state)
        return bool(described.members) or (state not in _NO_MEMBERS and state != "")

    return client.retrying(f"describing group {group!r}", attempt)


def commit_group_offsets(
    client: KafkaClient, group: str, offsets: Mapping[TopicPartition, int]
) -> None:
    """Commit offsets for a group with no active members (as kafka-consumer-groups
    --reset-offsets does); a group with live members answers UNKNOWN_MEMBER_ID or similar."""
    topics: dict[str, list[dict[str, object]]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        topics.setdefault(topic, []).append(
            {"partition_index": partition, "committed_offset": offset, "committed_metadata": ""}
        )

    fields = {
        "group_id": group,
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "group_instance_id": None,
        "topics": [{"name": t, "partitions": parts} for t, parts in topics.items()],
    }
    body = body_of(ApiKey.OFFSET_COMMIT, fields)

    def attempt() -> None:
        node = _coordinator(client, group)
        response = client.request(node, ApiKey.OFFSET_COMMIT, OFFSET_COMMIT, body).decode()
        for topic in response.topics:
            for p in topic.partitions:
                check_error(
                    int(p.error_code),
                    f"OffsetCommit for group {group!r} on {topic.name}-{p.partition_index} (stop "
                    "the group's consumers first)",
                    client.where,
                )

    client.retrying(f"committing the offsets of group {group!r}", attempt)
