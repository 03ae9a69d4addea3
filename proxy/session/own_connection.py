"""A client's own broker connection: dialled on first use, as the client's principal, closed
with the client.

It carries what no stage shares (Fetch, group membership, SASL the client does with the broker
itself, ...). Like the lanes it has an answer timeout, with each request's own allowance (a
Fetch's max_wait_ms, a JoinGroup's rebalance timeout, a Produce's timeout_ms), so a silent
broker can't hold a client's session for ever. When it ends, the session is told, and closes
the client connection once the answers that did come are written.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from kipside.protocol import Address, ApiKey, request_allowance_ms
from kipside.proxy.core.answers import Pending, UpstreamFailed
from kipside.proxy.core.client_side import UPSTREAM_GONE, Marker
from kipside.proxy.core.decisions import ClientRequest
from kipside.proxy.core.identity import Principal
from kipside.proxy.core.limits import ReportLimit
from kipside.proxy.session.peek import produce_acks
from kipside.proxy.telemetry.stats import Stats
from kipside.proxy.transport.wire import Wire
from kipside.proxy.upstream.connection import DEFAULT_ANSWER_TIMEOUT_SECONDS, UpstreamConnection

__all__ = ["OwnConnection", "Owner", "UpstreamDial"]

log = logging.getLogger("kipside.session")

UpstreamDial = Callable[[Address, Principal], Awaitable[Wire]]
"""How a session dials its own upstream connection, as its principal (core.identity)."""


async def plain_dial(address: Address, _principal: Principal) -> Wire:
    return await Wire.connect(address.host, address.port)


class Owner(Protocol):
    """The session, as its own connection sees it."""

    @property
    def principal(self) -> Principal: ...

    def describe(self) -> str: ...

    def own_gone(self, marker: Marker) -> None:
        """The connection ended: close after the answers that came."""


class OwnConnection:
    """One client's own upstream connection (see the module docstring)."""

    def __init__(
        self,
        candidates: list[Address],
        *,
        max_frame_bytes: int,
        stats: Stats,
        dial: UpstreamDial = plain_dial,
        connect_timeout: float = 10.0,
        answer_timeout: float = DEFAULT_ANSWER_TIMEOUT_SECONDS,
    ) -> None:
        self._candidates = candidates
        self._max_frame_bytes = max_frame_bytes
        self._stats = stats
        self._dial = dial
        self._connect_timeout = connect_timeout
        self._answer_timeout = answer_timeout
        self._report: ReportLimit | None = None
        self._owner: Owner | None = None
        self._gate: Callable[[], Awaitable[None]] | None = None
        self._nursery: trio.Nursery | None = None
        self.connection: UpstreamConnection | None = None
        self._failed = False

    def bind(
        self,
        owner: Owner,
        nursery: trio.Nursery,
        gate: Callable[[], Awaitable[None]],
        report: ReportLimit,
    ) -> None:
        """The session this connection is for, the nursery its tasks run in, what its reader
        waits on before each read (the client taking its answers), and where a limit it
        reaches is reported."""
        self._owner, self._nursery, self._gate, self._report = owner, nursery, gate, report

    def newest(self) -> Pending | None:
        connection = self.connection
        return None if connection is None else connection.last_in_flight()

    def barrier(self) -> Pending:
        """An answer that comes once the broker has handled everything this connection sent
        so far (acks=0 requests included); answered at once when the connection is closed
        (what it carried is as done as it will ever be) or was never opened."""
        connection = self.connection
        if connection is None or connection.closed:
            return Pending.answered(b"")
        try:
            return connection.barrier_nowait()
        except UpstreamFailed:
            return Pending.answered(b"")

    async def send(self, request: ClientRequest) -> Pending | None:
        """Send the request (dialling first if needed); its answer, or None when none is owed
        (acks=0). Raises UpstreamFailed if the broker can't be reached."""
        connection = self.connection or await self._open()
        header, frame = request.header, request.frame
        self._stats.upstream_requests[header.api_key] += 1
        # A ProduceRequest too short to hold its acks is malformed: DecodeError closes the client.
        expects_response = header.api_key != ApiKey.PRODUCE or produce_acks(frame, header) != 0
        return connection.send_nowait(
            frame,
            header.api_key,
            header.api_version,
            expects_response=expects_response,
            allowance=request_allowance_ms(frame, header) / 1000,
        )

    async def send_raw(self, frame: bytes) -> Pending:
        """A legacy SASL token, carried as it is on the connection its handshake went on."""
        if self.connection is None:  # cannot happen: the handshake went on it
            raise UpstreamFailed("a raw SASL token came with no upstream connection to carry it")
        await trio.lowlevel.checkpoint()
        return self.connection.send_raw_nowait(frame)

    async def _open(self) -> UpstreamConnection:
        assert self._nursery is not None and self._owner is not None
        problems = []
        for candidate in self._candidates:
            try:
                connection = await UpstreamConnection.open(
                    candidate,
                    self._nursery,
                    connect_timeout=self._connect_timeout,
                    dial=self._dial_as_owner,
                    name=f"upstream {candidate} for {self._owner.describe()}",
                    max_frame_bytes=self._max_frame_bytes,
                    answer_timeout=self._answer_timeout,
                    keep_correlation_ids=True,
                    on_closed=self._closed,
                    report=self._report,
                    gate=self._gate,
                )
            except UpstreamFailed as exc:
                problems.append(str(exc))
                continue
            self.connection = connection
            self._stats.upstream_connections += 1
            return connection
        raise UpstreamFailed(f"cannot reach upstream ({'; '.join(problems)})")

    async def _dial_as_owner(self, address: Address) -> Wire:
        assert self._owner is not None
        return await self._dial(address, self._owner.principal)

    def _closed(self, connection: UpstreamConnection, reason: str) -> None:
        self._stats.upstream_connections -= 1
        if connection is not self.connection or self._failed:
            return  # retired when the client authenticated
        self._failed = True
        assert self._owner is not None
        # Queued behind what is owed, so an idle client learns of the lost broker connection
        # at once and a busy one gets every answer that did arrive first.
        self._owner.own_gone(UPSTREAM_GONE)

    def log_lost(self, owner: Owner) -> None:
        if self.connection is not None:
            log.info(
                "%s: %s; closing so the client retries",
                owner.describe(),
                self.connection.close_reason,
            )

    def retire(self) -> None:
        """The client authenticated: a connection dialled before (for ApiVersions, which Kafka
        answers before authentication) is closed, so nothing it sends later rides on it."""
        before, self.connection = self.connection, None
        if before is not None and self._nursery is not None:
            self._nursery.start_soon(before.close_after_pending, 1.0)

    async def close_after_pending(self, grace_seconds: float) -> None:
        if self.connection is not None:
            await self.connection.close_after_pending(grace_seconds)

    async def aclose(self) -> None:
        if self.connection is not None:
            await self.connection.aclose()
