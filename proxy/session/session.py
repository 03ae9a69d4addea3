"""The trio driver of one client connection: core.ClientSide's bytes on a Wire, and the
pipeline's decisions carried out.

The logic is in plain objects: where a request goes is the pipeline's (core.decisions,
stages.pipeline); the answers owed in request order and what the client holds are
core.client_side's and core.limits'. This driver reads the client's socket (session.reading),
hands each request to the pipeline, carries out the decision (on the client's own broker
connection, session.own_connection, or a lane), writes the answers as they become ready
(session.answers), and keeps time (the idle and request-read deadlines). A session never
outlives its client connection: once the client has gone, its own broker connection is closed
and what it was owed is forgotten; a lost own connection closes the client connection, which the
client sees as a broker disconnect and retries. One session's failure never touches another's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import trio

from kipside.protocol import ApiKey, ProtocolError, RequestHeader
from kipside.proxy.core.answers import Pending, UpstreamFailed
from kipside.proxy.core.client_side import (
    DRAINED,
    RAW_TOKEN_CORRELATION_ID,
    REFUSED,
    ClientSide,
    Marker,
    Slot,
)
from kipside.proxy.core.decisions import (
    ClientRequest,
    Close,
    Pipeline,
    Take,
    Wait,
)
from kipside.proxy.core.identity import ANONYMOUS, Principal
from kipside.proxy.core.limits import ServerLimits
from kipside.proxy.security.client_sasl import ClientSasl
from kipside.proxy.session.answers import AnswerWriter
from kipside.proxy.session.carrying_out import carry_out
from kipside.proxy.session.own_connection import OwnConnection
from kipside.proxy.session.reading import Room, read_requests, watch_deadlines
from kipside.proxy.stages.sasl import raw_token
from kipside.proxy.transport.waiting import answer_of
from kipside.proxy.transport.wire import WRITE_GRACE_SECONDS, Wire

log = logging.getLogger("kipside.session")

# How long a closing session lets the broker finish what it was sent (acks=0 produce has no
# answer to wait for, and closing first would make the broker drop it).
OWN_CLOSE_GRACE_SECONDS = 1.0


class Session:
    """One client connection; to the stages, its handle (core.decisions.ClientHandle)."""

    def __init__(
        self,
        client: Wire,
        *,
        pipeline: Callable[[], Pipeline],
        own: OwnConnection,
        writer: AnswerWriter,
        limits: ServerLimits,
        max_frame_bytes: int,
        node_id: int | None = None,
        principal: Principal = ANONYMOUS,
        sasl: ClientSasl | None = None,
    ) -> None:
        self.wire = client
        self.peer = client.peername()
        self.node_id = node_id
        """The upstream node this client connected to (None: the bootstrap listener)."""
        self.principal = principal
        self.sasl = sasl if sasl is not None else ClientSasl()
        self.authenticated = False
        self.span: object = None
        """The span of the request being decided."""
        self._pipeline = pipeline
        self.writer = writer
        self.own = own
        self.limits = limits.client(self.describe, trio.current_time())
        self.side = ClientSide(self.limits, max_frame_bytes=max_frame_bytes, on_ready=self.flush)
        self._room = Room(self.limits)
        client.on_broken(self._client_broken)
        client.on_backlog(self.limits.backlog_changed)
        self._reader_scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._drained = trio.Event()
        self._gone = False
        self._closing = False

    # The handle the stages see ----------------------------------------------------------

    @property
    def client_id(self) -> str | None:
        return self.side.client_id

    def newest_own(self) -> Pending | None:
        return self.own.newest()

    def own_barrier(self) -> Pending:
        return self.own.barrier()

    def describe(self) -> str:
        who = f"client {self.peer}"
        if self.principal != ANONYMOUS:
            who += f" ({self.principal})"
        client_id = self.side.client_id if hasattr(self, "side") else None
        if client_id:
            who += f" (client.id {client_id!r})"
        return who

    def disconnect(self, reason: str) -> None:
        """Close the client connection now, as a broker would on a lost connection."""
        if self._nursery is not None and not self._closing:
            log.info("%s: %s; closing so the client resends", self.describe(), reason)
            self._stop()

    def authenticated_as(self, principal: Principal) -> None:
        """The client proved who it is: from now on its own connection is its principal's."""
        log.info("%s authenticated as %s", self.describe(), principal)
        self.principal = principal
        self.own.retire()

    # Lifetime ---------------------------------------------------------------------------

    def drain(self) -> None:
        """Stop reading requests; close once every request already read has been answered."""
        self._reader_scope.cancel()

    def _stop(self) -> None:
        if self._nursery is not None:
            self._closing = True
            self._nursery.cancel_scope.cancel()

    def _client_broken(self, reason: str) -> None:
        log.debug("%s: %s", self.describe(), reason)
        self._client_gone()

    def _client_gone(self) -> None:
        """Nothing owed can reach the client any more: nothing is waited for."""
        self._gone = True
        for slot in self.side.forget():
            self.writer.abandoned(slot)
        self._stop()

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.own.bind(self, nursery, self._room.answers, self.limits.report)
                nursery.start_soon(self._client_reader)
                nursery.start_soon(self.wire.run_flusher)
                nursery.start_soon(self._watch_deadlines)
                await self._drained.wait()
                # Every answer owed is written (or queued behind a slow client).
                await self.own.close_after_pending(OWN_CLOSE_GRACE_SECONDS)
                with trio.move_on_after(WRITE_GRACE_SECONDS):
                    await self.wire.drained()
                nursery.cancel_scope.cancel()
        finally:
            if self._gone:  # let the broker finish what it was sent (acks=0), briefly
                await self.own.close_after_pending(OWN_CLOSE_GRACE_SECONDS)
            await self.own.aclose()
            self.wire.close()
            self.limits.close()
        log.debug("%s: session ended", self.describe())

    async def _client_reader(self) -> None:
        with self._reader_scope:
            try:
                await read_requests(self, self.side, self.wire, self._room)
            except ProtocolError:
                self._stop()
                return
            except UpstreamFailed as exc:
                log.info("%s: %s; closing so the client retries", self.describe(), exc)
                self._stop()
                return
            self._client_gone()  # it closed its connection
            return
        self.side.end(DRAINED)  # drained: close after the answers already owed

    async def _watch_deadlines(self) -> None:
        await watch_deadlines(self.limits)
        self._stop()

    # Requests ---------------------------------------------------------------------------

    async def handle(self, header: RequestHeader | None, frame: bytes, now: float) -> None:
        """One whole request (header None: a legacy SASL token), read at `now`, decided and
        carried out."""
        took = self.limits.took(len(frame))
        if header is None:
            header = RAW_TOKEN_HEADER
            self.span = None
            decision, request = raw_token(self, frame), ClientRequest(header, frame, self, now)
        else:
            self.span = self.writer.request_span(self, header, frame)
            decision, request = self._pipeline().decide(ClientRequest(header, frame, self, now))
            while type(decision) is Wait:
                await self._wait(decision)
                decision, request = self._pipeline().decide(request)
        if type(decision) is Take:  # the usual produce: no await
            pending, raw = decision.pending, decision.raw
        else:
            pending, raw = await carry_out(decision, request, self.own)
        if pending is None:  # nothing is owed: the request holds nothing
            self.writer.finish(self.span)
            self.limits.written(now, took, 0)
        else:
            key, version, correlation_id = header.api_key, header.api_version, header.correlation_id
            span, merge = self.span, request.merge
            self.side.owe(Slot(key, version, correlation_id, pending, raw, now, span, merge, took))
        if type(decision) is Close:
            self.refuse(decision.reason, decision.level)
        elif request.close_after is not None:
            self.refuse(request.close_after, logging.INFO)

    async def _wait(self, wait: Wait) -> None:
        with trio.move_on_after(wait.limit) as limit:
            await answer_of(wait.pending)
        if limit.cancelled_caught:
            log.warning("%s: %s", self.describe(), wait.too_long)
            raise UpstreamFailed(wait.too_long)

    def refuse(self, reason: str, level: int) -> None:
        """Log the reason, stop reading, and close once the answers owed so far are written."""
        log.log(level, "%s %s; closing the connection", self.describe(), reason)
        self._reader_scope.cancel()
        self.side.end(REFUSED)

    def own_gone(self, marker: Marker) -> None:
        """The client's own broker connection ended: close after the answers that came."""
        self.side.end(marker)

    # Answers ----------------------------------------------------------------------------

    def flush(self) -> None:
        """Write every answer ready at the head of those owed, in order, in one call."""
        if self._closing:
            return  # closing: nothing more is written
        ready, marker = self.side.ready()
        stop = self.writer.write(self, ready) if ready else False
        if marker is DRAINED:
            self._drained.set()
        elif marker is not None:
            if marker is not REFUSED:
                self.own.log_lost(self)
            stop = True
        if stop:
            self._stop()


RAW_TOKEN_HEADER: Final = RequestHeader(
    ApiKey.SASL_AUTHENTICATE, 0, RAW_TOKEN_CORRELATION_ID, None, 0, 4
)
"""What a legacy SASL token is owed as: a SaslAuthenticate v0 answer with no correlation id."""
