"""Faults and Kafka behaviours the mirror must handle, simulated by filters on the shared relay
base (tests/relaykit), each in front of a real Tansu broker:
- CorruptingFetchRelay flips one byte inside the records of one record batch of a topic in every
  Fetch response that carries it: what a bad disk or a broken network path does. The batch's
  CRC-32C no longer matches.
- RefusingProduceRelay answers every ProduceRequest that names a topic with a prefix with an
  error code for every partition of that request (by default TOPIC_AUTHORIZATION_FAILED): a
  destination that refuses the mirror's writes (ACLs, a topic policy).
- LeaderElectionRelay answers the first Fetch and Produce requests of each partition with
  NOT_LEADER_OR_FOLLOWER, as brokers do while a leader moves.
- KafkaConfigSourcesRelay reports topic configs the way Apache Kafka does (Tansu marks them
  all as defaults), so the mirror's config copying can be checked.
- DeletedRecordsRelay moves a partition's log start forward, as retention or DeleteRecords do.
- PartitionGrowthRelay adds partitions to a topic, as CreatePartitions does on Apache Kafka.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from relaykit.base import Relay, response_frame
from relaykit.decisions import FORWARD, Answer, Conn, Decision, Forward, Request
from relaykit.tansu import tansu_behind
from testkit.broker import Broker

from kipside.protocol.apis import ApiKey
from kipside.protocol.fetch import MAX_VERSION as FETCH_MAX
from kipside.protocol.fetch import MIN_VERSION as FETCH_MIN
from kipside.protocol.fetch import parse_fetch_response
from kipside.protocol.headers import RequestHeader, build_frame, parse_response_header
from kipside.protocol.kafka_errors import ErrorCode
from kipside.protocol.messages import (
    build,
    decode_request,
    decode_response,
    encode_message,
    response_class,
)
from kipside.protocol.produce import (
    PartitionResult,
    ProduceResponseData,
    encode_produce_response,
    parse_produce_request,
)
from kipside.protocol.records import HEADER_SIZE, iter_batches

NOT_LEADER = int(ErrorCode.not_leader_or_follower)
OUT_OF_RANGE = int(ErrorCode.offset_out_of_range)


class CorruptingFetchRelay(Relay):
    """SIMULATION: the batch of `topic` that starts at `base_offset` arrives corrupted."""

    def __init__(self, topic: str, base_offset: int) -> None:
        super().__init__()
        self.topic = topic
        self.base_offset = base_offset
        self.corrupted = 0

    def on_response(self, conn: Conn, request: Request, frame: bytes) -> bytes | None:
        header = request.header
        if header.api_key != ApiKey.FETCH or not FETCH_MIN <= header.api_version <= FETCH_MAX:
            return frame
        body_offset = parse_response_header(frame, ApiKey.FETCH, header.api_version).body_offset
        data = parse_fetch_response(frame, body_offset, header.api_version)
        out = bytearray(frame)
        changed = False
        for p in data.partitions:
            if p.topic != self.topic:
                continue
            for batch in iter_batches(p.records, allow_partial_tail=True):
                if batch.base_offset != self.base_offset or batch.size <= HEADER_SIZE:
                    continue
                where = frame.find(bytes(batch.raw))
                if where >= 0:
                    out[where + HEADER_SIZE] ^= 0xFF  # first byte of the records section
                    changed = True
        if changed:
            with self._lock:
                self.corrupted += 1
        return bytes(out)


class RefusingProduceRelay(Relay):
    """SIMULATION: writes to topics starting with `prefix` are refused with `error_code`."""

    def __init__(self, prefix: str, error_code: int = int(ErrorCode.topic_authorization_failed)):
        super().__init__()
        self.prefix = prefix
        self.error_code = error_code
        self.refused = 0

    def on_request(self, conn: Conn, request: Request) -> Decision:
        h = request.header
        if h.api_key != ApiKey.PRODUCE or h.api_version < 3:
            return FORWARD
        produce = parse_produce_request(request.frame, h.body_offset, h.api_version)
        if not any(p.topic.startswith(self.prefix) for p in produce.partitions):
            return FORWARD
        with self._lock:
            self.refused += 1
        # Nothing of the request is written, so no partition may be reported written.
        results = tuple(
            PartitionResult(p.topic, p.partition, self.error_code) for p in produce.partitions
        )
        body = encode_produce_response(h.api_version, ProduceResponseData(results))
        return Answer(response_frame(h, body))


@dataclass
class RelayedBroker:
    relay: Relay
    broker: Broker  # its real listener: only the relay dials it

    @property
    def bootstrap(self) -> str:
        return self.relay.bootstrap


@contextmanager
def broker_behind(relay: Relay) -> Iterator[RelayedBroker]:
    """A fresh Tansu that advertises the relay's address, with the relay in front of it."""
    with tansu_behind(relay) as broker:
        yield RelayedBroker(relay, broker)


class LeaderElectionRelay(Relay):
    """SIMULATION of partition leader elections: the first `refusals` Fetch and Produce requests
    for each partition are answered NOT_LEADER_OR_FOLLOWER by the relay (never reaching the
    broker, so nothing is written), as a broker answers while leadership moves. Metadata still
    names the same node, which then serves the retries, as after an election back to it."""

    def __init__(self, refusals: int = 3) -> None:
        super().__init__()
        self.refusals = refusals
        self._left: dict[tuple[int, str, int], int] = {}
        self.refused = 0

    def _refuse(self, api: int, partitions: list[tuple[str, int]]) -> bool:
        with self._lock:
            due = [self._left.setdefault((api, t, p), self.refusals) for t, p in partitions]
            if not any(due):
                return False
            for t, p in partitions:
                key = (api, t, p)
                self._left[key] = max(self._left[key] - 1, 0)
            self.refused += 1
            return True

    def on_request(self, conn: Conn, request: Request) -> Decision:
        h = request.header
        if h.api_key == ApiKey.PRODUCE and h.api_version >= 3:
            produce = parse_produce_request(request.frame, h.body_offset, h.api_version)
            parts = [(p.topic, p.partition) for p in produce.partitions]
            if not self._refuse(ApiKey.PRODUCE, parts):
                return FORWARD
            results = tuple(PartitionResult(t, p, NOT_LEADER) for t, p in parts)
            body = encode_produce_response(h.api_version, ProduceResponseData(results))
            return Answer(response_frame(h, body))
        if h.api_key == ApiKey.FETCH and FETCH_MIN <= h.api_version <= FETCH_MAX:
            fetch = decode_request(ApiKey.FETCH, h.api_version, request.frame, h.body_offset)
            parts = [(t.topic, int(p.partition)) for t in fetch.topics for p in t.partitions]
            if not parts or not self._refuse(ApiKey.FETCH, parts):
                return FORWARD
            return Answer(response_frame(h, _fetch_errors(h.api_version, parts, NOT_LEADER)))
        return super().on_request(conn, request)


def _fetch_errors(version: int, parts: list[tuple[str, int]], code: int) -> bytes:
    topics: dict[str, list[dict[str, object]]] = {}
    for topic, partition in parts:
        topics.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "error_code": code,
                "high_watermark": -1,
                "last_stable_offset": -1,
                "log_start_offset": -1,
                "aborted_transactions": None,
                "preferred_read_replica": -1,
                "records": None,
            }
        )
    message = build(
        response_class(ApiKey.FETCH, version),
        {
            "throttle_time": 0,
            "error_code": 0,
            "session_id": 0,
            "responses": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
        },
    )
    return encode_message(message)


class KafkaConfigSourcesRelay(Relay):
    """SIMULATION of Apache Kafka's DescribeConfigs: a config set on the topic itself is reported
    with source DYNAMIC_TOPIC_CONFIG (1), and broker defaults come along with source
    DEFAULT_CONFIG (5). Tansu 0.6.0 reports a topic's own configs as DEFAULT_CONFIG and no
    defaults at all. Here every config Tansu returns becomes DYNAMIC_TOPIC_CONFIG, and one
    default, compression.type=producer, is added to each topic's answer."""

    def on_response(self, conn: Conn, request: Request, frame: bytes) -> bytes | None:
        h = request.header
        if h.api_key != ApiKey.DESCRIBE_CONFIGS:
            return super().on_response(conn, request, frame)
        body_offset = parse_response_header(frame, h.api_key, h.api_version).body_offset
        message = decode_response(h.api_key, h.api_version, frame, body_offset)
        results = []
        for result in message.results:
            configs = [dataclasses.replace(c, config_source=1) for c in result.configs]
            if configs:
                default = dataclasses.replace(
                    configs[0], name="compression.type", value="producer", config_source=5
                )
                configs.append(default)
            results.append(dataclasses.replace(result, configs=tuple(configs)))
        rebuilt = dataclasses.replace(message, results=tuple(results))
        return response_frame(h, encode_message(rebuilt))


class KafkaLikeSource(KafkaConfigSourcesRelay, LeaderElectionRelay):
    """Both simulations above, in front of one source broker."""


class DeletedRecordsRelay(Relay):
    """SIMULATION of records deleted from the front of a log (retention, DeleteRecords), which
    Tansu 0.6.0 can't do (its DeleteRecords resets the connection, seen here): once
    `delete_before(topic, partition, offset)` is called, ListOffsets(earliest) answers that
    offset and a Fetch below it is answered OFFSET_OUT_OF_RANGE, as Apache Kafka does."""

    def __init__(self) -> None:
        super().__init__()
        self._log_start: dict[tuple[str, int], int] = {}

    def delete_before(self, topic: str, partition: int, offset: int) -> None:
        with self._lock:
            self._log_start[(topic, partition)] = offset

    def on_request(self, conn: Conn, request: Request) -> Decision:
        h = request.header
        if h.api_key != ApiKey.FETCH or not FETCH_MIN <= h.api_version <= FETCH_MAX:
            return super().on_request(conn, request)
        fetch = decode_request(ApiKey.FETCH, h.api_version, request.frame, h.body_offset)
        asked = [
            (t.topic, int(p.partition), int(p.fetch_offset))
            for t in fetch.topics
            for p in t.partitions
        ]
        with self._lock:
            gone = [(t, p) for t, p, o in asked if o < self._log_start.get((t, p), -1)]
        if not gone or len(gone) != len(asked):
            return super().on_request(conn, request)
        return Answer(response_frame(h, _fetch_errors(h.api_version, gone, OUT_OF_RANGE)))

    def on_response(self, conn: Conn, request: Request, frame: bytes) -> bytes | None:
        h = request.header
        if h.api_key != ApiKey.LIST_OFFSETS:
            return super().on_response(conn, request, frame)
        asked = decode_request(h.api_key, h.api_version, request.frame, h.body_offset)
        earliest = {
            (t.name, int(p.partition_index))
            for t in asked.topics
            for p in t.partitions
            if p.timestamp == -2
        }
        body_offset = parse_response_header(frame, h.api_key, h.api_version).body_offset
        message = decode_response(h.api_key, h.api_version, frame, body_offset)
        topics = []
        with self._lock:
            for t in message.topics:
                parts = []
                for p in t.partitions:
                    start = self._log_start.get((t.name, int(p.partition_index)))
                    if start is not None and (t.name, int(p.partition_index)) in earliest:
                        p = dataclasses.replace(p, offset=type(p.offset)(max(int(p.offset), start)))
                    parts.append(p)
                topics.append(dataclasses.replace(t, partitions=tuple(parts)))
        return response_frame(h, encode_message(dataclasses.replace(message, topics=tuple(topics))))


class PartitionGrowthRelay(Relay):
    """SIMULATION of Apache Kafka's CreatePartitions (KIP-195), which Tansu 0.6.0 does not offer
    (it is missing from its ApiVersions; seen here). Topics created through the relay are
    created on Tansu with `capacity` partitions, and the relay shows clients only as many as
    were asked for: Metadata leaves the rest out. A CreatePartitions request is answered here
    and shows more of them, as Apache Kafka adds partitions; asking for fewer than a topic has,
    or more than the capacity, is answered INVALID_PARTITIONS as Kafka does. Partitions not yet
    shown are empty, and no client is told they exist."""

    def __init__(self, capacity: int = 8) -> None:
        super().__init__()
        self.capacity = capacity
        self._shown: dict[str, int] = {}
        self.grown: list[tuple[str, int]] = []

    def shown(self, topic: str) -> int | None:
        with self._lock:
            return self._shown.get(topic)

    def on_request(self, conn: Conn, request: Request) -> Decision:
        h = request.header
        if h.api_key == ApiKey.CREATE_TOPICS:
            asked = decode_request(h.api_key, h.api_version, request.frame, h.body_offset)
            topics = []
            with self._lock:
                for t in asked.topics:
                    self._shown.setdefault(t.name, int(t.num_partitions))
                    topics.append(dataclasses.replace(t, num_partitions=self.capacity))
            body = encode_message(dataclasses.replace(asked, topics=tuple(topics)))
            return Forward(build_frame(request.frame[4 : h.body_offset], body))
        if h.api_key == ApiKey.CREATE_PARTITIONS:
            return Answer(response_frame(h, self._grow(h.api_version, request, h.body_offset)))
        return super().on_request(conn, request)

    def _grow(self, version: int, request: Request, body_offset: int) -> bytes:
        asked = decode_request(ApiKey.CREATE_PARTITIONS, version, request.frame, body_offset)
        results = []
        with self._lock:
            for t in asked.topics:
                now, wanted = self._shown.get(t.name), int(t.count)
                error, message = 0, None
                if now is None:
                    error, message = int(ErrorCode.unknown_topic_or_partition), "unknown topic"
                elif not now < wanted <= self.capacity:
                    error = int(ErrorCode.invalid_partitions)
                    message = f"Topic currently has {now} partitions, {wanted} is not a valid count"
                elif not asked.validate_only:
                    self._shown[t.name] = wanted
                    self.grown.append((t.name, wanted))
                results.append({"name": t.name, "error_code": error, "error_message": message})
        message_class = response_class(ApiKey.CREATE_PARTITIONS, version)
        return encode_message(build(message_class, {"throttle_time": 0, "results": results}))

    def on_response(self, conn: Conn, request: Request, frame: bytes) -> bytes | None:
        h = request.header
        if h.api_key == ApiKey.API_VERSIONS:
            return _offering_create_partitions(h, frame)
        if h.api_key == ApiKey.METADATA:
            body_offset = parse_response_header(frame, h.api_key, h.api_version).body_offset
            message = decode_response(h.api_key, h.api_version, frame, body_offset)
            with self._lock:
                topics = [
                    dataclasses.replace(
                        t,
                        partitions=tuple(
                            p
                            for p in t.partitions
                            if int(p.partition_index) < self._shown.get(t.name, self.capacity)
                        ),
                    )
                    for t in message.topics
                ]
            rebuilt = dataclasses.replace(message, topics=tuple(topics))
            return response_frame(h, encode_message(rebuilt))
        return super().on_response(conn, request, frame)


def _offering_create_partitions(h: RequestHeader, frame: bytes) -> bytes:
    """An ApiVersions answer that also offers CreatePartitions v0-3."""
    head = parse_response_header(frame, ApiKey.API_VERSIONS, h.api_version)
    message = decode_response(ApiKey.API_VERSIONS, h.api_version, frame, head.body_offset)
    if message.error_code != 0:
        return frame
    entry = type(message.api_keys[0])
    keys = [k for k in message.api_keys if k.api_key != ApiKey.CREATE_PARTITIONS]
    keys.append(
        build(entry, {"api_key": ApiKey.CREATE_PARTITIONS, "min_version": 0, "max_version": 3})
    )
    rebuilt = dataclasses.replace(message, api_keys=tuple(keys))
    return response_frame(h, encode_message(rebuilt))
