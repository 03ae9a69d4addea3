"""One client connection: read its requests, route each, answer in request order.

Three kinds of route exist for a request: answered locally (e.g. an ApiVersions newer than
kipside knows), forwarded on the client's own upstream connection (opened lazily, closed with the
client), or handed to a shared route supplied by the server (multiplexed lanes, the produce
coalescer). Whatever the route, the client owes nothing to ordering: each request that expects a
response gets a slot in a FIFO, and the writer task sends slots back strictly in that order, so
one slow answer holds the later ones exactly as a broker connection would.

A session never outlives its client connection, and a lost dedicated upstream connection closes
the client connection, so the client sees a disconnect and retries as with a broker. One
session's failure never touches another's.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

import trio
from opentelemetry.trace import Span

from kipside.protocol import (
    Address,
    ApiKey,
    FrameDecoder,
    FrameError,
    FrameTooLargeError,
    LimitExceeded,
    ProtocolError,
    RequestHeader,
    api_name,
    parse_request_header,
)
from kipside.proxy.core.answers import Pending, UpstreamFailed
from kipside.proxy.security import ClientSasl
from kipside.proxy.security.identity import ANONYMOUS, Principal
from kipside.proxy.security.sasl_messages import SASL_APIS
from kipside.proxy.session.answers import (
    DRAINED,
    REFUSED,
    UPSTREAM_GONE,
    Marker,
    Slot,
    rewrite_answer,
)
from kipside.proxy.session.peek import produce_acks, produce_topics
from kipside.proxy.session.sasl_steps import take_raw_token, take_request
from kipside.proxy.stages.hooks import ApiVersionsPolicy, RequestCheck, SharedRoute
from kipside.proxy.telemetry.stats import Stats
from kipside.proxy.telemetry.tracing import Tracer, finish
from kipside.proxy.transport.dial import plain_dial
from kipside.proxy.transport.limits import ServerLimits
from kipside.proxy.transport.wire import WRITE_GRACE_SECONDS, Wire, WireBroken
from kipside.proxy.upstream.addresses import AddressRewriter
from kipside.proxy.upstream.connection import UpstreamConnection
from kipside.rules import Limits

log = logging.getLogger("kipside.session")

# How long a closing session lets the broker finish what it was sent (acks=0 produce has no
# answer to wait for, and closing first would make the broker drop it).
DEDICATED_CLOSE_GRACE_SECONDS = 1.0
# A session made without the server's limits (tests) has the defaults.
_DEFAULT_LIMITS = Limits()


UpstreamDial = Callable[[Address, Principal], Awaitable[Wire]]
"""How a session dials its own upstream connection, as its principal (see network.identity)."""


async def _plain(address: Address, _principal: Principal) -> Wire:
    return await plain_dial(address)


class Session:
    def __init__(
        self,
        client: Wire,
        upstream_candidates: list[Address],
        *,
        rewriter: AddressRewriter,
        versions: ApiVersionsPolicy,
        max_frame_bytes: int,
        shared_route: SharedRoute | None = None,
        node_id: int | None = None,
        stats: Stats | None = None,
        tracer: Tracer | None = None,
        connect_timeout: float = 10.0,
        dial: UpstreamDial = _plain,
        principal: Principal = ANONYMOUS,
        sasl: ClientSasl | None = None,
        check: RequestCheck | None = None,
        limits: ServerLimits | None = None,
    ) -> None:
        self.wire = client
        self.wire.on_broken(self._client_broken)
        self.upstream_candidates = upstream_candidates
        self.rewriter = rewriter
        self.versions = versions
        self.max_frame_bytes = max_frame_bytes
        self.shared_route = shared_route
        self.node_id = node_id
        """The upstream node this client connected to (None: the bootstrap listener)."""
        self.authenticated = False
        """Set once the client speaks SASL: from then on everything uses its own connection."""
        self.principal = principal
        """Who the client is to kipside; shared connections are per principal."""
        self.sasl = sasl if sasl is not None else ClientSasl()
        """The client's SASL: carried to the broker, or answered by kipside (network.sasl)."""
        self.check = check
        """What the client's principal may send (features.principals); None: anything."""
        self._dial = dial
        self.stats = stats if stats is not None else Stats()
        self.tracer = tracer
        self.current_span: Span | None = None
        """The span of the request being routed (for shared routes to link or annotate)."""
        self.connect_timeout = connect_timeout
        self.peer = self.wire.peername()
        self.client_id: str | None = None
        self.dedicated: UpstreamConnection | None = None
        self._dedicated_failed = False
        self._reader_scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._slots: deque[Slot | Marker] = deque()
        self._drained = trio.Event()
        if limits is None:
            limits = ServerLimits(lambda: _DEFAULT_LIMITS, self.stats)
        self.limits = limits.client(self.wire, self.describe, self._stop)
        """What kipside holds for this client, its request caps and deadlines."""
        self._unowed = 0
        """Bytes of the request being routed that no slot holds yet (released if none will)."""

    def describe(self) -> str:
        who = f"client {self.peer}"
        if self.principal != ANONYMOUS:
            who += f" ({self.principal})"
        if self.client_id:
            who += f" (client.id {self.client_id!r})"
        return who

    def disconnect(self, reason: str) -> None:
        """Close the client connection now, as a broker would on a lost connection."""
        if self._nursery is not None and not self._nursery.cancel_scope.cancel_called:
            log.info("%s: %s; closing so the client resends", self.describe(), reason)
            self._stop()

    def drain(self) -> None:
        """Stop reading requests; close once every request already read has been answered."""
        self._reader_scope.cancel()

    def _stop(self) -> None:
        """End the session now: nothing more is read or written."""
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._client_reader)
                nursery.start_soon(self.wire.run_flusher)
                nursery.start_soon(self.limits.deadlines.watch)
                await self._drained.wait()
                # Every answer owed is written (or queued behind a slow client).
                if self.dedicated is not None:
                    await self.dedicated.close_after_pending(DEDICATED_CLOSE_GRACE_SECONDS)
                with trio.move_on_after(WRITE_GRACE_SECONDS):
                    await self.wire.drained()
                nursery.cancel_scope.cancel()
        finally:
            if self.dedicated is not None:
                await self.dedicated.aclose()
            self.wire.close()
            self.limits.close()
        log.debug("%s: session ended", self.describe())

    def _client_broken(self, reason: str) -> None:
        log.debug("%s: %s", self.describe(), reason)
        self._stop()

    # Requests --------------------------------------------------------------------------

    async def _client_reader(self) -> None:
        with self._reader_scope:
            await self._read_requests()
        # Drained (or the client is done sending): close after the answers already owed.
        self._slots.append(DRAINED)
        self.flush()

    async def _read_requests(self) -> None:
        decoder = FrameDecoder(max_frame_bytes=self.max_frame_bytes, min_frame_bytes=8)
        wire = self.wire
        limits = self.limits
        while True:
            data = await wire.receive()
            if not data:
                # The client is done sending. Requests already forwarded still run (acks=0
                # ones included); the session closes once the owed answers are out.
                return
            decoder.receive_data(data)
            while True:
                try:
                    # Past an in-flight limit (the client sends faster than its answers come,
                    # or reads none of them): take no more requests until it drops, as a broker
                    # mutes a connection (network.limits). Before each request, not each read:
                    # one read can hold thousands of small ones; and after the last one, so
                    # nothing more is read either.
                    if limits.over() is not None:
                        await limits.room(decoder.buffered)
                    if self.sasl.raw_token_due:  # after SaslHandshake v0: no Kafka header
                        decoder.min_frame_bytes = 0
                    frame = decoder.next_frame()
                    if frame is None:
                        break
                    if self.sasl.raw_token_due:
                        take_raw_token(self, frame)
                        if not self.sasl.raw_token_due:
                            decoder.min_frame_bytes = 8
                        continue
                    header = parse_request_header(frame, limits.decode)
                    if header.client_id and self.client_id is None:
                        self.client_id = header.client_id
                    self._unowed = limits.took(len(frame))
                    await self._on_request(frame, header)
                    if self._unowed:  # no answer is owed (acks=0, ...): it holds nothing
                        limits.written(self._unowed, 0)
                        self._unowed = 0
                except (FrameTooLargeError, LimitExceeded) as exc:
                    limits.refused(exc, frame if isinstance(exc, LimitExceeded) else None)
                    self._stop()
                    return
                except ProtocolError as exc:
                    kind = "not Kafka" if isinstance(exc, FrameError) else "a malformed request"
                    log.warning(
                        "%s sent %s: %s; closing the connection", self.describe(), kind, exc
                    )
                    self._stop()
                    return
                except UpstreamFailed as exc:
                    log.info("%s: %s; closing so the client retries", self.describe(), exc)
                    self._stop()
                    return
            # Every whole request is taken: what is left starts (or continues) the next one,
            # which must be whole within limits.request_read_timeout_ms.
            limits.read(decoder.buffered)

    async def _on_request(self, frame: bytes, header: RequestHeader) -> None:
        api_key, version = header.api_key, header.api_version
        stats = self.stats
        stats.client_requests[api_key] += 1
        stats.client_request_bytes[api_key] += len(frame)
        started = time.perf_counter()
        span = None
        if self.tracer is not None and self.tracer.enabled_for(api_key):
            span = self.tracer.request_span(
                api_key,
                version,
                self.client_id,
                self.peer,
                produce_topics(frame, header, self.limits.decode),
                correlation_id=header.correlation_id,
            )
        self.current_span = span
        # Checked here, not in the call: it is the only SASL cost of every other request.
        if (api_key in SASL_APIS or self.sasl.terminates) and take_request(self, frame, header):
            finish(span)
            return
        verdict = None if self.check is None else self.check(self, frame, header)
        if isinstance(verdict, bytes):  # refused whole: kipside's answer
            self._owe(header, Pending.answered(verdict), False, started, span)
            return
        if verdict is not None:  # refused in part: the rest goes on
            if verdict.frame is not None:
                await self._forward(verdict.frame, header, started, span, verdict.merge)
            else:
                finish(span)
            if verdict.close is not None:
                self.refuse(verdict.close, logging.INFO)
            return
        if api_key == ApiKey.API_VERSIONS:
            local = self.versions.unsupported_answer(header)
            if local is not None:
                self._owe(header, Pending.answered(local), False, started, span)
                return
        await self._forward(frame, header, started, span)

    async def _forward(
        self,
        frame: bytes,
        header: RequestHeader,
        started: float,
        span: Span | None,
        merge: Callable[[bytes], bytes] | None = None,
    ) -> None:
        """Send the request on a shared route or the client's own connection."""
        api_key, version = header.api_key, header.api_version
        if self.shared_route is not None:
            routed = await self.shared_route(self, frame, header)
            if routed is not None:
                if routed.pending is not None:
                    self._owe(header, routed.pending, routed.raw, started, span, merge)
                else:
                    finish(span)
                return
        expects_response = api_key != ApiKey.PRODUCE or produce_acks(frame, header) != 0
        connection = await self._dedicated_connection()
        self.stats.upstream_requests[api_key] += 1
        answer = await connection.send(frame, api_key, version, expects_response=expects_response)
        if answer is not None:
            self._owe(header, answer, True, started, span, merge)
        else:
            finish(span)

    def _owe(
        self,
        header: RequestHeader,
        pending: Pending,
        raw: bool,
        started: float,
        span: Span | None,
        merge: Callable[[bytes], bytes] | None = None,
    ) -> None:
        slot = Slot(
            header.api_key,
            header.api_version,
            header.correlation_id,
            pending,
            raw,
            started,
            span,
            merge,
            request_bytes=self._owed_request(),
        )
        self._slots.append(slot)
        pending.on_done(lambda: self._arrived(slot))

    def _arrived(self, slot: Slot) -> None:
        """A slot's answer came: held until it is written (network.limits)."""
        frame = slot.pending.frame
        if frame is not None:
            slot.answer_bytes = len(frame)
            self.limits.arrived(len(frame))
        self.flush()

    def _owed_request(self) -> int:
        """The routed request's bytes, now held by its slot until its answer is written."""
        size, self._unowed = self._unowed, 0
        return size

    def queue(self, slot: Slot) -> None:
        """Owe the client this answer after those owed before it."""
        self._slots.append(slot)

    def refuse(self, reason: str, level: int) -> None:
        """Log the reason, stop reading, and close once the answers owed so far are written."""
        log.log(level, "%s %s; closing the connection", self.describe(), reason)
        self._slots.append(REFUSED)
        self._reader_scope.cancel()
        self.flush()

    def authenticated_as(self, principal: Principal) -> None:
        """The client proved who it is: from now on every upstream connection is its
        principal's. One dialled before (for ApiVersions, which Kafka answers before
        authentication) is closed, so nothing the client sends later rides on it."""
        log.info("%s authenticated as %s", self.describe(), principal)
        self.principal = principal
        before, self.dedicated = self.dedicated, None
        if before is not None and self._nursery is not None:
            self._nursery.start_soon(before.close_after_pending, DEDICATED_CLOSE_GRACE_SECONDS)

    async def _dedicated_connection(self) -> UpstreamConnection:
        if self.dedicated is not None:
            return self.dedicated
        assert self._nursery is not None
        problems = []
        for candidate in self.upstream_candidates:
            try:
                connection = await UpstreamConnection.open(
                    candidate,
                    self._nursery,
                    name=f"upstream {candidate} for {self.describe()}",
                    max_frame_bytes=self.max_frame_bytes,
                    on_closed=self._dedicated_closed,
                    connect_timeout=self.connect_timeout,
                    dial=self._dial_upstream,
                    report=self.limits.report,
                    gate=self.limits.answers_room,
                )
            except UpstreamFailed as exc:
                problems.append(str(exc))
                continue
            self.dedicated = connection
            self.stats.upstream_connections += 1
            return connection
        raise UpstreamFailed(f"cannot reach upstream ({'; '.join(problems)})")

    async def _dial_upstream(self, address: Address) -> Wire:
        return await self._dial(address, self.principal)

    def _dedicated_closed(self, connection: UpstreamConnection, reason: str) -> None:
        if connection is not self.dedicated:  # retired when the client authenticated
            self.stats.upstream_connections -= 1
            return
        # Queued behind what is owed, so an idle client learns of the lost broker connection
        # at once and a busy one gets every answer that did arrive first.
        if not self._dedicated_failed:
            self._dedicated_failed = True
            self.stats.upstream_connections -= 1
            self._slots.append(UPSTREAM_GONE)
            self.flush()

    # Responses -------------------------------------------------------------------------

    def flush(self) -> None:
        """Write every answer that is ready at the head of the FIFO, in order, in one call."""
        if self._nursery is not None and self._nursery.cancel_scope.cancel_called:
            # Closing: nothing more is written, and the failures of the requests still in
            # flight (all of them, when a broker connection drops) are not logged one by one.
            return
        ready: list[Slot] = []
        frames: list[bytes] = []
        stop = False
        try:
            slots = self._slots
            while slots:
                slot = slots[0]
                if isinstance(slot, Marker):
                    stop = self._at_marker(slot)
                    break
                if not slot.pending.done:
                    break
                slots.popleft()
                frame = self._answer(slot)
                if frame is None:
                    stop = True
                    break
                ready.append(slot)
                frames.append(frame)
        except Exception:
            log.exception("%s: unexpected error writing answers; closing", self.describe())
            stop = True
        if frames:
            self._write(ready, frames)
        if stop:
            self._stop()

    def _at_marker(self, marker: Marker) -> bool:
        """Whether the session must stop now (DRAINED lets run() close it gracefully)."""
        if marker is DRAINED:
            self._drained.set()
            return False
        if marker is REFUSED:
            return True
        if self.dedicated is not None:
            log.info(
                "%s: %s; closing so the client retries",
                self.describe(),
                self.dedicated.close_reason,
            )
        return True

    def _answer(self, slot: Slot) -> bytes | None:
        """The frame to send for an answered slot; None if the session must close instead."""
        frame = slot.pending.frame
        if frame is None:
            finish(slot.span, "UPSTREAM_UNAVAILABLE")
            log.info(
                "%s: no answer to %s v%d (%s); closing so the client retries",
                self.describe(),
                api_name(slot.api_key),
                slot.api_version,
                slot.pending.failure,
            )
            return None
        if not slot.raw and slot.merge is None:
            return frame
        return rewrite_answer(slot, frame, self.versions, self.rewriter, self.sasl, self.describe())

    def _write(self, ready: list[Slot], frames: list[bytes]) -> None:
        try:
            self.wire.write(frames)
        except WireBroken:
            for slot in ready:
                finish(slot.span, "CLIENT_DISCONNECTED")
            self._stop()
            return
        now = time.perf_counter()
        stats = self.stats
        request_bytes = answer_bytes = 0
        for slot, frame in zip(ready, frames, strict=True):
            request_bytes += slot.request_bytes
            answer_bytes += slot.answer_bytes
            stats.client_response_bytes[slot.api_key] += len(frame)
            stats.observe_latency(slot.api_key, now - slot.started)
            if slot.span is not None:
                finish(slot.span, slot.pending.error_name)
        self.limits.written(request_bytes, answer_bytes)
