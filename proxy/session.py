"""One client connection and its own upstream connection (1:1), forwarding in order.

A session reads request frames from the client, forwards them upstream, and writes responses
back in request order, rewriting the few that must change (ApiVersions, addresses). Three tasks:
the client reader (owns writes upstream), the upstream reader, and the response writer (owns
writes to the client), so each stream has exactly one writer. Ordering comes from a FIFO of
"slots", one per request that expects a response; a slot is either answered upstream or
already answered locally.

A session never outlives either of its connections: when one side goes away the other is closed,
so the client sees a disconnect and retries as it would with a broker. One session's failure
never touches another's.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import trio

from protocol.apis import ApiKey, api_name
from protocol.errors import DecodeError, FrameError, ProtocolError
from protocol.framing import FrameDecoder
from protocol.headers import (
    RequestHeader,
    parse_request_header,
    parse_response_header,
    response_correlation_id,
)
from protocol.primitives import INT16, read_uvarint

from .addresses import AddressRewriter, carries_addresses
from .nodes import Address
from .versions import MAX_API_VERSIONS_VERSION, VersionPolicy

log = logging.getLogger("kipside.session")

READ_SIZE = 256 * 1024
# A write to a peer that stops reading must not keep a shielded task alive forever.
WRITE_GRACE_SECONDS = 10.0


@dataclass(slots=True)
class Slot:
    """A response the client is owed, in request order."""

    api_key: int
    api_version: int
    correlation_id: int
    local_response: bytes | None = None


@dataclass(frozen=True, slots=True)
class _Marker:
    """A point in the slot queue after which no response will be owed."""

    reason: str


# The upstream connection ended: nothing after this point can be answered.
UPSTREAM_GONE = _Marker("upstream gone")
# The session is draining for shutdown: no requests were read after this point.
DRAINED = _Marker("drained")


def produce_acks(frame: bytes, header: RequestHeader) -> int:
    """The acks field of a ProduceRequest (v3+ has transactional_id before it)."""
    offset = header.body_offset
    if header.api_version >= 3:
        if header.api_version >= 9:
            length, offset = read_uvarint(frame, offset)
            offset += max(length - 1, 0)
        else:
            (length,) = INT16.unpack_from(frame, offset)
            offset += 2 + max(length, 0)
    if offset + 2 > len(frame):
        raise DecodeError("ProduceRequest is too short to hold acks")
    return int(INT16.unpack_from(frame, offset)[0])


async def _write(stream: trio.abc.SendStream, data: bytes) -> None:
    # Shielded so a cancel never leaves half a frame on the wire; bounded so a peer that
    # stopped reading can't hold shutdown hostage.
    with trio.move_on_after(WRITE_GRACE_SECONDS, shield=True) as scope:
        await stream.send_all(data)
    if scope.cancelled_caught:
        raise trio.BrokenResourceError("peer did not accept the write in time")


class Session:
    def __init__(
        self,
        client: trio.SocketStream,
        upstream_candidates: list[Address],
        *,
        rewriter: AddressRewriter,
        versions: VersionPolicy,
        max_frame_bytes: int,
        connect_timeout: float = 10.0,
    ) -> None:
        self.client = client
        self.upstream_candidates = upstream_candidates
        self.upstream_address = upstream_candidates[0]
        self._reader_scope = trio.CancelScope()
        self.rewriter = rewriter
        self.versions = versions
        self.max_frame_bytes = max_frame_bytes
        self.connect_timeout = connect_timeout
        try:
            host, port = client.socket.getpeername()[:2]
            self.peer = f"{host}:{port}"
        except OSError:
            self.peer = "<unknown>"
        self.client_id: str | None = None
        self._slots_send, self._slots_recv = trio.open_memory_channel[Slot | _Marker](math.inf)
        self._frames_send, self._frames_recv = trio.open_memory_channel[bytes](8)

    def describe(self) -> str:
        who = f"client {self.peer}"
        if self.client_id:
            who += f" (client.id {self.client_id!r})"
        return who

    def drain(self) -> None:
        """Stop reading requests; close once every forwarded request has been answered."""
        self._reader_scope.cancel()

    async def _connect(self) -> trio.SocketStream | None:
        problems = []
        for candidate in self.upstream_candidates:
            try:
                with trio.fail_after(self.connect_timeout):
                    stream = await trio.open_tcp_stream(candidate.host, candidate.port)
            except (OSError, trio.TooSlowError) as exc:
                problems.append(f"{candidate}: {exc or 'timed out'}")
                continue
            self.upstream_address = candidate
            return stream
        log.warning(
            "%s: cannot reach upstream (%s); closing so the client retries",
            self.describe(),
            "; ".join(problems),
        )
        return None

    async def run(self) -> None:
        upstream = await self._connect()
        if upstream is None:
            await trio.aclose_forcefully(self.client)
            return
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._client_reader, upstream, nursery.cancel_scope)
                nursery.start_soon(self._upstream_reader, upstream)
                nursery.start_soon(self._response_writer, nursery.cancel_scope)
        finally:
            await trio.aclose_forcefully(upstream)
            await trio.aclose_forcefully(self.client)
        log.debug("%s: session ended", self.describe())

    async def _client_reader(
        self, upstream: trio.SocketStream, session_scope: trio.CancelScope
    ) -> None:
        with self._reader_scope:
            await self._read_requests(upstream, session_scope)
        # Drained: the writer closes the session after the responses already owed.
        self._slots_send.send_nowait(DRAINED)

    async def _read_requests(
        self, upstream: trio.SocketStream, session_scope: trio.CancelScope
    ) -> None:
        decoder = FrameDecoder(max_frame_bytes=self.max_frame_bytes, min_frame_bytes=8)
        while True:
            try:
                data = await self.client.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                session_scope.cancel()
                return
            decoder.receive_data(data)
            while True:
                try:
                    frame = decoder.next_frame()
                    if frame is None:
                        break
                    header = parse_request_header(frame)
                except ProtocolError as exc:
                    self._client_protocol_error(exc)
                    session_scope.cancel()
                    return
                if header.client_id and self.client_id is None:
                    self.client_id = header.client_id
                await self._on_request(frame, header, upstream, session_scope)

    def _client_protocol_error(self, exc: ProtocolError) -> None:
        kind = "not Kafka" if isinstance(exc, FrameError) else "malformed request"
        log.warning("%s sent %s: %s; closing the connection", self.describe(), kind, exc)

    async def _on_request(
        self,
        frame: bytes,
        header: RequestHeader,
        upstream: trio.SocketStream,
        session_scope: trio.CancelScope,
    ) -> None:
        api_key, version = header.api_key, header.api_version
        if api_key == ApiKey.API_VERSIONS and version > MAX_API_VERSIONS_VERSION:
            local = self.versions.unsupported_response(header.correlation_id)
            self._slots_send.send_nowait(Slot(api_key, version, header.correlation_id, local))
            return
        expects_response = True
        if api_key == ApiKey.PRODUCE:
            try:
                expects_response = produce_acks(frame, header) != 0
            except DecodeError as exc:
                self._client_protocol_error(exc)
                session_scope.cancel()
                return
        if expects_response:
            self._slots_send.send_nowait(Slot(api_key, version, header.correlation_id))
        try:
            await _write(upstream, frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.info(
                "%s: upstream %s went away while sending %s (%s); closing so the client retries",
                self.describe(),
                self.upstream_address,
                api_name(api_key),
                exc,
            )
            session_scope.cancel()

    async def _upstream_reader(self, upstream: trio.SocketStream) -> None:
        decoder = FrameDecoder(max_frame_bytes=self.max_frame_bytes, min_frame_bytes=4)
        async with self._frames_send:
            while True:
                try:
                    data = await upstream.receive_some(READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    self._slots_send.send_nowait(UPSTREAM_GONE)
                    return
                decoder.receive_data(data)
                while True:
                    try:
                        frame = decoder.next_frame()
                    except ProtocolError as exc:
                        log.error(
                            "upstream %s sent bytes that are not Kafka (%s); closing %s",
                            self.upstream_address,
                            exc,
                            self.describe(),
                        )
                        self._slots_send.send_nowait(UPSTREAM_GONE)
                        return
                    if frame is None:
                        break
                    await self._frames_send.send(frame)

    async def _response_writer(self, session_scope: trio.CancelScope) -> None:
        async for slot in self._slots_recv:
            if isinstance(slot, _Marker):
                if slot is UPSTREAM_GONE:
                    log.info(
                        "%s: upstream %s closed the connection; closing so the client retries",
                        self.describe(),
                        self.upstream_address,
                    )
                session_scope.cancel()
                return
            if slot.local_response is not None:
                response = slot.local_response
            else:
                try:
                    frame = await self._frames_recv.receive()
                except trio.EndOfChannel:
                    session_scope.cancel()
                    return
                processed = self._process_response(slot, frame)
                if processed is None:
                    session_scope.cancel()
                    return
                response = processed
            try:
                await _write(self.client, response)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                session_scope.cancel()
                return

    def _process_response(self, slot: Slot, frame: bytes) -> bytes | None:
        correlation_id = response_correlation_id(frame)
        if correlation_id != slot.correlation_id:
            log.error(
                "upstream %s answered correlation id %d while %s expected %d (%s v%d); "
                "closing the connection",
                self.upstream_address,
                correlation_id,
                self.describe(),
                slot.correlation_id,
                api_name(slot.api_key),
                slot.api_version,
            )
            return None
        try:
            if slot.api_key == ApiKey.API_VERSIONS:
                header = parse_response_header(frame, slot.api_key, slot.api_version)
                return self.versions.rewrite_response(slot.api_version, frame, header)
            if carries_addresses(slot.api_key, slot.api_version):
                header = parse_response_header(frame, slot.api_key, slot.api_version)
                return self.rewriter.rewrite(slot.api_key, slot.api_version, frame, header)
        except DecodeError as exc:
            log.error(
                "%s: cannot rewrite %s v%d response from upstream %s (%s); kipside never "
                "passes broker addresses through, so the connection is closed. Report this "
                "with the broker version",
                self.describe(),
                api_name(slot.api_key),
                slot.api_version,
                self.upstream_address,
                exc,
            )
            return None
        return frame
