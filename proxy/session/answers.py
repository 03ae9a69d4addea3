"""How the answers a session owes reach its client: rewritten, written, counted and traced.

A broker's raw answer needs kipside's rewrites before the client may see it (broker addresses to
kipside's, ApiVersions to what kipside supports, a SaslHandshake's outcome noted for the
client's SASL); a narrowed request's answer gets the refused partitions back first. One
`AnswerWriter` serves every session of a server: it holds no per-client state.
"""

from __future__ import annotations

import logging
from typing import Protocol

import trio
from opentelemetry.trace import Span

from kipside.protocol import (
    ApiKey,
    DecodeError,
    RequestHeader,
    ResponseHeader,
    api_name,
    parse_response_header,
)
from kipside.proxy.core.client_side import Slot
from kipside.proxy.core.limits import ClientLimits
from kipside.proxy.security.client_sasl import ClientSasl
from kipside.proxy.session.peek import produce_topics
from kipside.proxy.telemetry.stats import Stats
from kipside.proxy.telemetry.tracing import Tracer, finish
from kipside.proxy.transport.wire import Wire, WireBroken
from kipside.proxy.upstream.addresses import AddressRewriter, carries_addresses

__all__ = ["AnswerWriter", "ApiVersionsPolicy", "Client"]

log = logging.getLogger("kipside.session")


class ApiVersionsPolicy(Protocol):
    """What kipside advertises in ApiVersions (stages.versions.VersionPolicy is the one)."""

    def rewrite_response(self, api_version: int, frame: bytes, header: ResponseHeader) -> bytes:
        """The broker's ApiVersions answer, cut to what kipside can serve."""


class Client(Protocol):
    """The session as the writer sees it."""

    wire: Wire
    sasl: ClientSasl
    limits: ClientLimits
    peer: str

    @property
    def client_id(self) -> str | None: ...

    def describe(self) -> str: ...


class AnswerWriter:
    """Writes sessions' answers; shared by every session of one server."""

    def __init__(
        self,
        versions: ApiVersionsPolicy,
        rewriter: AddressRewriter,
        stats: Stats,
        tracer: Tracer | None = None,
    ) -> None:
        self.versions = versions
        self.rewriter = rewriter
        self.stats = stats
        self.tracer = tracer

    def request_span(self, client: Client, header: RequestHeader, frame: bytes) -> Span | None:
        """Count a request read, and start its span if its API is traced."""
        api_key = header.api_key
        stats = self.stats
        stats.client_requests[api_key] += 1
        stats.client_request_bytes[api_key] += len(frame)
        tracer = self.tracer
        if tracer is None or not tracer.enabled_for(api_key):
            return None
        return tracer.request_span(
            api_key,
            header.api_version,
            client.client_id,
            client.peer,
            produce_topics(frame, header, client.limits.decode),
            correlation_id=header.correlation_id,
        )

    @staticmethod
    def finish(span: object, error: str | None = None) -> None:
        finish(span, error)  # type: ignore[arg-type]

    def abandoned(self, slot: Slot) -> None:
        """A slot whose client has gone."""
        finish(slot.span, "CLIENT_DISCONNECTED")  # type: ignore[arg-type]

    def write(self, client: Client, ready: list[Slot]) -> bool:
        """Write the answers of `ready` (answered slots, in order) as one write; True if the
        session must close instead of going on (an answer failed or can't be rewritten, or the
        client's socket broke)."""
        frames: list[bytes] = []
        written: list[Slot] = []
        stop = False
        try:
            for slot in ready:
                frame = self._answer(client, slot)
                if frame is None:
                    stop = True
                    break
                frames.append(frame)
                written.append(slot)
        except Exception:
            log.exception("%s: unexpected error writing answers; closing", client.describe())
            stop = True
        if not frames:
            return stop
        try:
            client.wire.write(frames)
        except WireBroken:
            for slot in written:
                finish(slot.span, "CLIENT_DISCONNECTED")  # type: ignore[arg-type]
            return True
        self._count(client, written, frames)
        return stop

    def _count(self, client: Client, written: list[Slot], frames: list[bytes]) -> None:
        now = trio.current_time()  # slots start at the time their request was read
        stats = self.stats
        response_bytes, observe = stats.client_response_bytes, stats.observe_latency
        request_bytes = answer_bytes = 0
        for slot, frame in zip(written, frames, strict=True):
            request_bytes += slot.request_bytes
            answer_bytes += slot.answer_bytes
            response_bytes[slot.api_key] += len(frame)
            observe(slot.api_key, now - slot.started)
            if slot.span is not None:
                finish(slot.span, slot.pending.error_name)  # type: ignore[arg-type]
        client.limits.written(now, request_bytes, answer_bytes)

    def _answer(self, client: Client, slot: Slot) -> bytes | None:
        """The frame to send for an answered slot; None if the session must close instead."""
        frame = slot.pending.frame
        if frame is None:
            finish(slot.span, "UPSTREAM_UNAVAILABLE")  # type: ignore[arg-type]
            log.info(
                "%s: no answer to %s v%d (%s); closing so the client retries",
                client.describe(),
                api_name(slot.api_key),
                slot.api_version,
                slot.pending.failure,
            )
            return None
        if not slot.raw and slot.merge is None:
            return frame
        return self._rewritten(client, slot, frame)

    def _rewritten(self, client: Client, slot: Slot, frame: bytes) -> bytes | None:
        """The answer as the client must see it (a raw one is the broker's: rewritten; a merged
        one gets the refused partitions first); None if it can't be rewritten (logged: the
        session closes rather than pass a broker address through)."""
        if slot.merge is not None:
            try:
                frame = slot.merge(frame)
            except DecodeError as exc:
                log.error(
                    "%s: cannot read the broker's %s v%d answer to add the partitions the "
                    "principals rules refused (%s); closing the connection",
                    client.describe(),
                    api_name(slot.api_key),
                    slot.api_version,
                    exc,
                )
                return None
        if not slot.raw:
            return frame
        try:
            if slot.api_key == ApiKey.SASL_HANDSHAKE:
                client.sasl.broker_answered(slot.api_key, slot.api_version, frame)
                return frame
            if slot.api_key == ApiKey.API_VERSIONS:
                header = parse_response_header(frame, slot.api_key, slot.api_version)
                return self.versions.rewrite_response(slot.api_version, frame, header)
            if carries_addresses(slot.api_key, slot.api_version):
                header = parse_response_header(frame, slot.api_key, slot.api_version)
                return self.rewriter.rewrite(slot.api_key, slot.api_version, frame, header)
        except DecodeError as exc:
            log.error(
                "%s: the broker's %s v%d answer cannot be read (%s); kipside never passes "
                "broker addresses through, so the connection is closed. If the broker is a "
                "real Kafka broker, report this with its version",
                client.describe(),
                api_name(slot.api_key),
                slot.api_version,
                exc,
            )
            return None
        return frame
