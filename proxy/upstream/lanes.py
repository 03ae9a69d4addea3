"""Lanes: the few upstream connections per broker node that the clients of one principal share.

Each (node, principal) gets `coalescing.lanes` connections, dialled as that principal (see
core.identity): two principals never share a lane. Which lane carries a client's produce
batches is the produce coalescer's choice; short request/response APIs are spread over the
lanes with their correlation ids remapped. A lane whose connection broke is redialled on next
use; what was in flight on it fails (see stages.coalescing for produce). Lanes never carry a
connection whose SASL exchange passes through kipside to the broker: that identity belongs to
one client connection alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

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
from kipside.proxy.core.answers import Pending, UpstreamFailed
from kipside.proxy.core.identity import ANONYMOUS, Principal
from kipside.proxy.core.limits import ReportLimit
from kipside.proxy.telemetry.stats import Stats
from kipside.proxy.transport.dial import Dial, plain_dial
from kipside.proxy.transport.waiting import answer_of
from kipside.proxy.upstream.connection import (
    DEFAULT_ANSWER_TIMEOUT_SECONDS,
    UpstreamConnection,
)

log = logging.getLogger("kipside.lanes")

# How long a new lane waits for the broker's ApiVersions answer before giving up on it.
PROBE_TIMEOUT_SECONDS = 10.0


class LanePool:
    """The shared upstream connections to one broker node for one principal."""

    def __init__(
        self,
        node_id: int,
        address: Callable[[], Address | None],
        *,
        lanes: int,
        nursery: trio.Nursery,
        max_frame_bytes: int,
        stats: Stats,
        principal: Principal = ANONYMOUS,
        dial: Dial = plain_dial,
        report: ReportLimit | None = None,
        answer_timeout: float = DEFAULT_ANSWER_TIMEOUT_SECONDS,
    ) -> None:
        self.node_id = node_id
        self.answer_timeout = answer_timeout
        """Seconds a lane's oldest request may go unanswered before the lane is closed
        (upstream.connection)."""
        self._report = report
        self.principal = principal
        self._dial = dial
        self._address = address
        self.lanes = lanes
        self._nursery = nursery
        self._max_frame_bytes = max_frame_bytes
        self._stats = stats
        self._connections: list[UpstreamConnection | None] = [None] * lanes
        self._connecting: list[trio.Lock] = [trio.Lock() for _ in range(lanes)]
        self.produce_versions: tuple[int, int] | None = None
        self.broker_versions: dict[int, tuple[int, int]] = {}
        """API key -> (min, max) version the node offers, from its ApiVersions answer to the
        first lane (empty until a lane is open)."""
        self._next_short = 0
        self._lanes = tuple(Lane(self, index) for index in range(lanes))

    def open_connections(self) -> int:
        return sum(1 for c in self._connections if c is not None and not c.closed)

    def next_short_lane(self) -> int:
        self._next_short = (self._next_short + 1) % self.lanes
        return self._next_short

    def short_lane(self) -> Lane:
        """The lane the next short request goes on (they take turns)."""
        return self._lanes[self.next_short_lane()]

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
                    name=f"lane {index} to node {self.node_id} ({address}){self._for_whom()}",
                    max_frame_bytes=self._max_frame_bytes,
                    on_closed=self._lane_closed,
                    dial=self._dial,
                    report=self._report,
                    answer_timeout=self.answer_timeout,
                )
            except UpstreamFailed as exc:
                raise UpstreamFailed(f"cannot reach node {self.node_id} at {exc}") from exc
            self._stats.upstream_connections += 1
            if self.produce_versions is None:
                try:
                    # Bounded: a broker that never answers must not wedge the lane forever.
                    with trio.fail_after(PROBE_TIMEOUT_SECONDS):
                        versions = await self._broker_versions(connection)
                except (UpstreamFailed, trio.TooSlowError) as exc:
                    await connection.aclose()
                    if isinstance(exc, UpstreamFailed):
                        raise
                    raise UpstreamFailed(
                        f"node {self.node_id} did not answer ApiVersions within "
                        f"{PROBE_TIMEOUT_SECONDS:g} s"
                    ) from exc
                if ApiKey.PRODUCE not in versions:
                    await connection.aclose()
                    raise UpstreamFailed(f"node {self.node_id} does not offer Produce")
                self.broker_versions = versions
                self.produce_versions = versions[ApiKey.PRODUCE]
            self._connections[index] = connection
            log.info("%s open", connection.name)
            return connection

    def _for_whom(self) -> str:
        return "" if self.principal == ANONYMOUS else f" for {self.principal}"

    def _lane_closed(self, connection: UpstreamConnection, reason: str) -> None:
        self._stats.upstream_connections -= 1
        if connection.shut_down:  # kipside is stopping: no failure, nothing to say
            log.debug("%s", reason)
            return
        self._stats.lane_failures += 1
        log.info("%s", reason)

    def offers(self, api_key: int, version: int) -> bool:
        """Whether the node offers `version` of the API (as far as its first lane heard)."""
        low, high = self.broker_versions.get(api_key, (0, -1))
        return low <= version <= high

    async def _broker_versions(self, connection: UpstreamConnection) -> dict[int, tuple[int, int]]:
        request = build_frame(encode_request_header(ApiKey.API_VERSIONS, 0, 0, "kipside"), b"")
        pending = await connection.send(request, ApiKey.API_VERSIONS, 0)
        assert pending is not None
        frame = await answer_of(pending)
        header = parse_response_header(frame, ApiKey.API_VERSIONS, 0)
        message = decode_response(ApiKey.API_VERSIONS, 0, frame, header.body_offset)
        if message.error_code != ErrorCode.none:
            raise UpstreamFailed(f"node {self.node_id} refused ApiVersions: {message.error_code}")
        return {
            int(entry.api_key): (int(entry.min_version), int(entry.max_version))
            for entry in message.api_keys
        }

    async def request(
        self, frame: bytes, api_key: int, api_version: int, lane: int | None = None
    ) -> bytes:
        """Send one short request on the next lane (or on `lane`: requests that must reach the
        broker in order, one after the other) and wait for its answer frame."""
        index = self.next_short_lane() if lane is None else lane
        connection = await self.connection(index)
        self._stats.upstream_requests[api_key] += 1
        pending = await connection.send(frame, api_key, api_version)
        assert pending is not None
        return await answer_of(pending)

    async def close_lane(self, index: int) -> None:
        """Close one lane's connection (redialled on next use)."""
        connection = self._connections[index]
        self._connections[index] = None
        if connection is not None:
            await connection.aclose()

    def count(self, api_key: int) -> None:
        self._stats.upstream_requests[api_key] += 1

    async def aclose(self) -> None:
        for connection in self._connections:
            if connection is not None:
                await connection.aclose()


class Lane:
    """One lane of a pool, as a request's route (core.decisions.Lane)."""

    __slots__ = ("index", "pool")

    def __init__(self, pool: LanePool, index: int) -> None:
        self.pool = pool
        self.index = index

    def send(self, frame: bytes, api_key: int, api_version: int) -> Pending | None:
        """Send now if the lane's connection is open; None if it must be dialled first."""
        connection = self.pool.live(self.index)
        if connection is None:
            return None
        self.pool.count(api_key)
        return connection.send_nowait(frame, api_key, api_version)

    async def dial_and_send(self, frame: bytes, api_key: int, api_version: int) -> Pending:
        """Dial the lane's connection if needed (UpstreamFailed if it can't be), then send."""
        connection = await self.pool.connection(self.index)
        self.pool.count(api_key)
        pending = await connection.send(frame, api_key, api_version)
        assert pending is not None
        return pending
