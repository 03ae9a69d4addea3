"""Lanes: the few upstream connections per broker node that all clients share.

Each node gets `coalescing.lanes` connections. A client's produce batches for a partition stay on
one lane while any of them is outstanding, which keeps their order (LanePlacement); short
request/response APIs are spread over the lanes with their correlation ids remapped. A lane whose
connection broke is redialled on next use; what was in flight on it fails (see proxy.coalesce
for produce). Lanes never carry SASL-authenticated traffic: a connection's identity belongs to
one client.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Hashable

import trio

from kipside.protocol import (
    Address,
    ApiKey,
    ErrorCode,
    build_frame,
    decode_response,
    encode_request_header,
    parse_response_header,
)
from kipside.proxy.network.upstream import UpstreamConnection, UpstreamFailed
from kipside.proxy.telemetry.stats import Stats

log = logging.getLogger("kipside.lanes")

# How long a new lane waits for the broker's ApiVersions answer before giving up on it.
PROBE_TIMEOUT_SECONDS = 10.0


# The lane of each acks value while clients of several acks values produce to one node.
_ACKS_LANE = {-1: 0, 1: 1, 0: 2}


def lane_index(topic: str, partition: int, lanes: int) -> int:
    """Stable across processes and restarts (unlike hash(), which is salted per process)."""
    return (zlib.crc32(topic.encode("utf-8")) + partition) % lanes


class LanePlacement:
    """Which lane carries each client's produce batches for a partition, keeping their order.

    Order matters per client connection and partition (a producer's sequence; Apache Kafka
    defines no order between two producers). While any batch of a client for a partition is
    outstanding (queued or in flight) on a lane, that client's next batches for it go to the
    same lane, behind it: a lane keeps them in order and a broker answers one connection's
    requests in order, so nothing overtakes. Otherwise:
    - while batches of another acks value are outstanding on the node, the batch goes to its
      acks value's lane: a ProduceRequest carries one acks value, so a lane shared by two values
      would take turns between them, halving what each request carries;
    - else partitions spread over the lanes by a stable hash, so the broker works on several
      requests at once.
    """

    def __init__(self) -> None:
        self._placed: dict[tuple[Hashable, int, str, int], list[int]] = {}
        """(client, node, topic, partition) -> [lane, outstanding batches]."""
        self._by_acks: dict[tuple[int, int], int] = {}
        """(node, acks) -> outstanding batches."""

    def place(
        self, client: Hashable, node_id: int, topic: str, partition: int, acks: int, lanes: int
    ) -> int:
        """The lane for one more batch of this client and partition (counted until release)."""
        key = (client, node_id, topic, partition)
        placed = self._placed.get(key)
        if placed is None:
            mixed = any(n and k[0] == node_id and k[1] != acks for k, n in self._by_acks.items())
            lane = _ACKS_LANE.get(acks, 0) if mixed else lane_index(topic, partition, lanes)
            placed = self._placed[key] = [lane % lanes, 0, acks]
        placed[1] += 1
        by_acks = (node_id, placed[2])
        self._by_acks[by_acks] = self._by_acks.get(by_acks, 0) + 1
        return placed[0]

    def release(self, client: Hashable, node_id: int, topic: str, partition: int) -> None:
        """One batch of this client and partition is no longer outstanding."""
        key = (client, node_id, topic, partition)
        placed = self._placed.get(key)
        if placed is None:
            return
        placed[1] -= 1
        self._by_acks[(node_id, placed[2])] -= 1
        if placed[1] <= 0:
            del self._placed[key]

    def outstanding(self) -> int:
        return sum(placed[1] for placed in self._placed.values())


class LanePool:
    """The shared upstream connections to one broker node."""

    def __init__(
        self,
        node_id: int,
        address: Callable[[], Address | None],
        *,
        lanes: int,
        nursery: trio.Nursery,
        max_frame_bytes: int,
        stats: Stats,
    ) -> None:
        self.node_id = node_id
        self._address = address
        self.lanes = lanes
        self._nursery = nursery
        self._max_frame_bytes = max_frame_bytes
        self._stats = stats
        self._connections: list[UpstreamConnection | None] = [None] * lanes
        self._connecting: list[trio.Lock] = [trio.Lock() for _ in range(lanes)]
        self.produce_versions: tuple[int, int] | None = None
        self._next_short = 0

    def open_connections(self) -> int:
        return sum(1 for c in self._connections if c is not None and not c.closed)

    def next_short_lane(self) -> int:
        self._next_short = (self._next_short + 1) % self.lanes
        return self._next_short

    def live(self, index: int) -> UpstreamConnection | None:
        """The lane's connection if it is open now (no dialling)."""
        connection = self._connections[index]
        return connection if connection is not None and not connection.closed else None

    async def connection(self, index: int) -> UpstreamConnection:
        """The lane's live connection, dialled (again) if needed. Raises UpstreamFailed."""
        connection = self._connections[index]
        if connection is not None and not connection.closed:
            return connection
        async with self._connecting[index]:
            connection = self._connections[index]
            if connection is not None and not connection.closed:
                return connection
            address = self._address()
            if address is None:
                raise UpstreamFailed(f"node {self.node_id} has no known address")
            try:
                connection = await UpstreamConnection.open(
                    address,
                    self._nursery,
                    name=f"lane {index} to node {self.node_id} ({address})",
                    max_frame_bytes=self._max_frame_bytes,
                    on_closed=self._lane_closed,
                )
            except UpstreamFailed as exc:
                raise UpstreamFailed(f"cannot reach node {self.node_id} at {exc}") from exc
            self._stats.upstream_connections += 1
            if self.produce_versions is None:
                try:
                    # Bounded: a broker that never answers must not wedge the lane forever.
                    with trio.fail_after(PROBE_TIMEOUT_SECONDS):
                        self.produce_versions = await self._broker_produce_versions(connection)
                except (UpstreamFailed, trio.TooSlowError) as exc:
                    await connection.aclose()
                    if isinstance(exc, UpstreamFailed):
                        raise
                    raise UpstreamFailed(
                        f"node {self.node_id} did not answer ApiVersions within "
                        f"{PROBE_TIMEOUT_SECONDS:g} s"
                    ) from exc
            self._connections[index] = connection
            log.info("%s open", connection.name)
            return connection

    def _lane_closed(self, connection: UpstreamConnection, reason: str) -> None:
        self._stats.upstream_connections -= 1
        self._stats.lane_failures += 1
        log.info("%s", reason)

    async def _broker_produce_versions(self, connection: UpstreamConnection) -> tuple[int, int]:
        request = build_frame(encode_request_header(ApiKey.API_VERSIONS, 0, 0, "kipside"), b"")
        pending = await connection.send(request, ApiKey.API_VERSIONS, 0)
        assert pending is not None
        frame = await pending.wait()
        header = parse_response_header(frame, ApiKey.API_VERSIONS, 0)
        message = decode_response(ApiKey.API_VERSIONS, 0, frame, header.body_offset)
        if message.error_code != ErrorCode.none:
            raise UpstreamFailed(f"node {self.node_id} refused ApiVersions: {message.error_code}")
        for entry in message.api_keys:
            if entry.api_key == ApiKey.PRODUCE:
                return int(entry.min_version), int(entry.max_version)
        raise UpstreamFailed(f"node {self.node_id} does not offer Produce")

    async def request(self, frame: bytes, api_key: int, api_version: int) -> bytes:
        """Send one short request on the next lane and wait for its answer frame."""
        connection = await self.connection(self.next_short_lane())
        self._stats.upstream_requests[api_key] += 1
        pending = await connection.send(frame, api_key, api_version)
        assert pending is not None
        return await pending.wait()

    async def aclose(self) -> None:
        for connection in self._connections:
            if connection is not None:
                await connection.aclose()
