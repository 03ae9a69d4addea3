"""A small blocking Kafka client over protocol/, for Spark's driver and Python workers.

It knows one cluster: it dials the bootstrap brokers, learns brokers and partition leaders from
Metadata, negotiates each API's version per broker from ApiVersions, and keeps one connection
per broker. Operations run under librdkafka's retry policy (pipeline.kafka.retry): a retriable
error or a broken connection refreshes metadata, backs off and tries again until the timeout,
so a leader that moves is followed, not reported. What it must never do: decode what it does
not need, hide a non-retriable error, or wait without a deadline. Not thread-safe: one client
per thread (Spark runs one task at a time per Python worker).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from kipside.protocol import (
    Address,
    ApiKey,
    Buffer,
    ProtocolError,
    Response,
    VersionRange,
    api_name,
    build_request,
    encode_message,
    error_name,
    is_retriable,
    pick_version,
)

from .connection import BrokerConnection, ConnectionFailed
from .errors import BrokerError, RetriableError
from .login import log_in
from .retry import RetryPolicy, call_with_retries
from .security import PLAINTEXT, Security, tls_context

__all__ = [
    "ClientConfig",
    "ClusterMetadata",
    "DedicatedConnection",
    "KafkaClient",
    "PartitionMetadata",
    "TopicMetadata",
]

T = TypeVar("T")
BodyBuilder = Callable[[int], Sequence[Buffer] | Buffer]

_API_VERSIONS_VERSION: Final = 2
_METADATA: Final = VersionRange(4, 12)
_FIND_COORDINATOR: Final = VersionRange(1, 3)


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Kafka client settings, named after the Kafka client configs they stand for."""

    client_id: str = "kipside-pipeline"
    connect_timeout_ms: int = 10_000
    """socket.connection.setup.timeout.ms"""
    request_timeout_ms: int = 30_000
    """request.timeout.ms"""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    security: Security = PLAINTEXT
    """security.protocol, sasl.*, ssl.* (pipeline.kafka.security)"""
    settings_hint: str = "option kafka.sasl.jaas.config"
    """Where the user sets the credentials, named in a failed login's message."""


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    error_code: int


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    error_code: int
    partitions: dict[int, PartitionMetadata]
    internal: bool


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    brokers: dict[int, Address]
    topics: dict[str, TopicMetadata]
    cluster_id: str | None
    controller: int


@dataclass(frozen=True, slots=True)
class DedicatedConnection:
    connection: BrokerConnection
    versions: dict[int, VersionRange]

    def version(self, api_key: int, ours: VersionRange) -> int:
        return pick_version(api_key, self.versions, ours, broker_name=self.connection.name)


class KafkaClient:
    """One Kafka cluster, seen from the pipeline. `role` names it in every error message."""

    def __init__(
        self, bootstrap: Sequence[Address], *, role: str, config: ClientConfig | None = None
    ) -> None:
        if not bootstrap:
            raise ValueError(f"the {role} needs at least one bootstrap broker")
        self.bootstrap = tuple(bootstrap)
        self.role = role
        self.config = config or ClientConfig()
        self._connections: dict[int, BrokerConnection] = {}
        self._versions: dict[int, dict[int, VersionRange]] = {}
        self._brokers: dict[int, Address] = {}
        self._metadata: ClusterMetadata | None = None
        self._coordinators: dict[tuple[str, int], int] = {}
        self._bootstrap_turn = 0

    def __enter__(self) -> KafkaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()

    @property
    def where(self) -> str:
        return f"the {self.role} at {','.join(map(str, self.bootstrap))}"

    # Retrying ------------------------------------------------------------------------------

    def retrying(self, what: str, attempt: Callable[[], T]) -> T:
        """Run `attempt` under the retry policy; each retriable failure refreshes metadata."""
        return call_with_retries(
            f"{what} ({self.where})",
            attempt,
            self.config.retry,
            before_retry=lambda _exc: self.invalidate_metadata(),
        )

    def invalidate_metadata(self) -> None:
        self._metadata = None
        self._coordinators.clear()

    # Connections and versions ----------------------------------------------------------------

    def _open(
        self, address: Address, name: str
    ) -> tuple[BrokerConnection, dict[int, VersionRange]]:
        security = self.config.security
        conn = BrokerConnection(
            address,
            client_id=self.config.client_id,
            connect_timeout=self.config.connect_timeout_ms / 1000,
            request_timeout=self.config.request_timeout_ms / 1000,
            name=name,
            tls=tls_context(security.tls) if security.tls is not None else None,
        )
        try:
            message = build_request(ApiKey.API_VERSIONS, _API_VERSIONS_VERSION, {})
            response = conn.request(
                ApiKey.API_VERSIONS, _API_VERSIONS_VERSION, encode_message(message)
            ).decode()
        except (ConnectionFailed, ProtocolError):
            conn.close()
            raise
        if response.error_code != 0:
            conn.close()
            raise BrokerError(
                f"{name} refused ApiVersions v{_API_VERSIONS_VERSION} with "
                f"{error_name(response.error_code)}",
                code=int(response.error_code),
            )
        versions = {
            int(k.api_key): VersionRange(int(k.min_version), int(k.max_version))
            for k in response.api_keys
        }
        if security.sasl is not None:
            try:
                log_in(conn, versions, security.sasl, self.config.settings_hint)
            except BaseException:
                conn.close()
                raise
        return conn, versions

    def _bootstrap_connection(self) -> int:
        """Connect to the next bootstrap broker that answers; its key is negative."""
        reasons = []
        for _ in range(len(self.bootstrap)):
            index = self._bootstrap_turn % len(self.bootstrap)
            self._bootstrap_turn += 1
            key = -1 - index
            if key in self._connections and not self._connections[key].closed:
                return key
            address = self.bootstrap[index]
            try:
                conn, versions = self._open(address, f"{self.role} bootstrap broker {address}")
            except ConnectionFailed as exc:
                reasons.append(str(exc))
                continue
            self._connections[key] = conn
            self._versions[key] = versions
            return key
        raise RetriableError(f"no bootstrap broker of {self.where} answered: {'; '.join(reasons)}")

    def _node_connection(self, node: int) -> BrokerConnection:
        conn = self._connections.get(node)
        if conn is not None and not conn.closed:
            return conn
        conn, versions = self._open_node(node)
        self._connections[node] = conn
        self._versions[node] = versions
        return conn

    def _open_node(self, node: int) -> tuple[BrokerConnection, dict[int, VersionRange]]:
        """A new connection to `node`, found in the metadata (refreshed once if it is not there)."""
        address = self._brokers.get(node)
        if address is None:
            self.metadata(refresh=True)
            address = self._brokers.get(node)
        if address is None:
            raise RetriableError(f"node {node} of {self.where} is not in the cluster's metadata")
        try:
            return self._open(address, f"{self.role} node {node} ({address})")
        except ConnectionFailed as exc:
            raise RetriableError(str(exc)) from exc

    def connection(self, node: int | None) -> tuple[int, BrokerConnection]:
        """The connection to `node`, or to any broker when node is None; (key, connection)."""
        if node is None:
            for key, conn in self._connections.items():
                if not conn.closed:
                    return key, conn
            key = self._bootstrap_connection()
            return key, self._connections[key]
        return node, self._node_connection(node)

    def version(self, key: int, api_key: int, ours: VersionRange) -> int:
        conn = self._connections[key]
        return pick_version(api_key, self._versions[key], ours, broker_name=conn.name)

    def request(
        self, node: int | None, api_key: int, ours: VersionRange, body: BodyBuilder
    ) -> Response:
        """One request to `node` (None: any broker) at the best common version.

        A broken connection is dropped and raised as RetriableError.
        """
        key, conn = self.connection(node)
        version = self.version(key, api_key, ours)
        try:
            return conn.request(api_key, version, body(version))
        except ConnectionFailed as exc:
            raise RetriableError(f"{api_name(api_key)}: {exc}") from exc

    def dedicated(self, node: int) -> DedicatedConnection:
        """A new connection to `node` that only its caller uses, for requests kept in flight
        (the shared ones answer one request at a time, and must not interleave with these)."""
        return DedicatedConnection(*self._open_node(node))

    def coordinator(self, key: str, key_type: int) -> int:
        """The node coordinating a group (key_type 0) or a transactional id (1), from
        FindCoordinator; remembered until the metadata is refreshed (a retriable error)."""
        known = self._coordinators.get((key, key_type))
        if known is not None:
            return known
        body = body_of(ApiKey.FIND_COORDINATOR, {"key": key, "key_type": key_type})
        response = self.request(None, ApiKey.FIND_COORDINATOR, _FIND_COORDINATOR, body).decode()
        what = "group" if key_type == 0 else "transactional id"
        check_error(int(response.error_code), f"FindCoordinator for {what} {key!r}", self.where)
        node = int(response.node_id)
        self.remember_broker(node, str(response.host), int(response.port))
        self._coordinators[(key, key_type)] = node
        return node

    def remember_broker(self, node: int, host: str, port: int) -> None:
        """A broker address learned outside Metadata (FindCoordinator)."""
        if node >= 0 and port > 0:
            self._brokers[node] = Address(host, port)

    # Metadata -------------------------------------------------------------------------------

    def metadata(
        self, topics: Sequence[str] | None = None, *, refresh: bool = False
    ) -> ClusterMetadata:
        """Brokers and topics (all topics when `topics` is None). Cached until invalidated.

        Asking for named topics always asks the broker, never auto-creating them.
        """
        if topics is None and self._metadata is not None and not refresh:
            return self._metadata

        names = None if topics is None else [{"name": t, "topic_id": None} for t in topics]
        fields = {
            "topics": names,
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        }
        body = body_of(ApiKey.METADATA, fields)
        response = self.request(None, ApiKey.METADATA, _METADATA, body).decode()
        brokers = {int(b.node_id): Address(str(b.host), int(b.port)) for b in response.brokers}
        found: dict[str, TopicMetadata] = {}
        for t in response.topics:
            parts = {
                int(p.partition_index): PartitionMetadata(
                    str(t.name),
                    int(p.partition_index),
                    int(p.leader_id),
                    int(getattr(p, "leader_epoch", -1)),
                    int(p.error_code),
                )
                for p in t.partitions
            }
            found[str(t.name)] = TopicMetadata(
                str(t.name), int(t.error_code), parts, bool(getattr(t, "is_internal", False))
            )
        self._brokers.update(brokers)
        for node, address in brokers.items():
            conn = self._connections.get(node)
            if conn is not None and conn.address != address:
                conn.close()  # the node moved: dial its new address next time
        cluster_id = getattr(response, "cluster_id", None)
        controller = int(getattr(response, "controller_id", -1))
        result = ClusterMetadata(brokers, found, cluster_id, controller)
        if topics is None:
            self._metadata = result
        return result

    def leader(self, topic: str, partition: int) -> int:
        """The partition's leader node, refreshing metadata once if it is unknown."""
        for refresh in (False, True):
            meta = self.metadata(refresh=refresh)
            info = meta.topics.get(topic)
            p = info.partitions.get(partition) if info is not None else None
            if p is not None and p.leader >= 0 and p.error_code == 0:
                return p.leader
        raise RetriableError(f"{topic}-{partition} has no leader in {self.where} yet")


def body_of(api_key: int, fields: dict[str, Any]) -> Callable[[int], bytes]:
    """The body of a request with these fields at whatever version is chosen (the kio adapter
    leaves out the fields a version does not have)."""
    return lambda version: encode_message(build_request(api_key, version, fields))


def check_error(code: int, what: str, where: str) -> None:
    """Raise the right error for a Kafka error code in an answer (0 is fine)."""
    if code == 0:
        return
    name = error_name(code)
    if is_retriable(code):
        raise RetriableError(f"{what}: {where} answered {name}", code=code)
    raise BrokerError(f"{what}: {where} answered {name}", code=code)


def field_or(message: Any, name: str, default: Any) -> Any:
    """A kio field that exists only from some version on, or its default below it."""
    return getattr(message, name, default)
