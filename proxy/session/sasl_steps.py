"""A session's SASL steps: what one client connection does with its SASL requests and tokens.

`ClientSasl` (network.sasl) decides, per request or legacy raw token, whether kipside carries
it to the broker (passthrough) or answers it itself (termination, `--sasl-credentials`); this
module acts on that decision for the client's session (network.session): it owes the client
kipside's answer in its place in request order, carries a raw token opaque on the client's own
upstream connection, switches the session to the principal the client proved, or refuses the
connection. It never reads a token itself (ClientSasl does) and never logs a secret; it knows
the session only as `SaslSession`.
"""

from __future__ import annotations

import logging
import time
from typing import Final, Protocol

from kipside.protocol import ApiKey, RequestHeader
from kipside.proxy.core.answers import Pending, UpstreamFailed
from kipside.proxy.security import ClientSasl, SaslStep
from kipside.proxy.security.identity import Principal
from kipside.proxy.security.sasl_messages import SASL_APIS
from kipside.proxy.session.answers import Slot
from kipside.proxy.upstream.connection import UpstreamConnection

__all__ = ["SaslSession", "take_raw_token", "take_request"]


# A raw SASL token (the frames after a SaslHandshake v0) has no Kafka header: kipside's answer
# to it is owed as a SaslAuthenticate v0 slot with no correlation id.
RAW_TOKEN_CORRELATION_ID: Final = -1


class SaslSession(Protocol):
    """What the SASL steps need of a client's session (network.session.Session)."""

    sasl: ClientSasl

    @property
    def dedicated(self) -> UpstreamConnection | None:
        """The client's own upstream connection, if it has one."""

    def describe(self) -> str: ...

    def queue(self, slot: Slot) -> None:
        """Owe the client this answer after those owed before it."""

    def flush(self) -> None:
        """Write every answer ready at the head of the queue."""

    def refuse(self, reason: str, level: int) -> None:
        """Log the reason, stop reading, and close once the answers owed so far are written."""

    def authenticated_as(self, principal: Principal) -> None:
        """The client proved it is this principal."""


def take_request(session: SaslSession, frame: bytes, header: RequestHeader) -> bool:
    """Whether the client's SASL takes this request (answered, or refused); False: route it as
    any other request. The session asks only for SASL requests, and for every request while
    kipside terminates SASL."""
    step = _step_for(session.sasl, frame, header)
    if step is None:
        return False
    _act(session, step, header.api_key, header.api_version, header.correlation_id)
    return True


def take_raw_token(session: SaslSession, frame: bytes) -> None:
    """A legacy SASL token (after SaslHandshake v0): answered here or carried opaque."""
    sasl = session.sasl
    if sasl.terminates:
        _act(session, sasl.raw_token(frame))
        return
    connection = session.dedicated
    if connection is None:  # cannot happen: the handshake went on it
        raise UpstreamFailed("a raw SASL token came with no upstream connection to carry it")
    pending = connection.send_raw_nowait(frame)
    sasl.raw_token_forwarded()
    session.queue(Slot(ApiKey.SASL_AUTHENTICATE, 0, -1, pending, False, time.perf_counter(), None))
    pending.on_done(session.flush)


def _step_for(sasl: ClientSasl, frame: bytes, header: RequestHeader) -> SaslStep | None:
    """How kipside takes a request as the client's SASL stands; None: route it as usual."""
    if not sasl.terminates:
        forwarding = sasl.forwarding(frame, header)
        return None if forwarding.answer is None and forwarding.close is None else forwarding
    step = sasl.before_authentication(header)
    if step is None and header.api_key in SASL_APIS:
        step = sasl.answer(frame, header)
    return step


def _act(
    session: SaslSession,
    step: SaslStep,
    key: int = ApiKey.SASL_AUTHENTICATE,
    version: int = 0,
    cid: int = RAW_TOKEN_CORRELATION_ID,
) -> None:
    """Owe the client kipside's SASL answer (a raw token's by default), then act on it."""
    if step.answer is not None:
        pending = Pending.answered(step.answer)
        session.queue(Slot(key, version, cid, pending, False, time.perf_counter(), None))
    if step.principal is not None:
        session.authenticated_as(step.principal)
    if step.close is not None:
        session.refuse(step.close, logging.WARNING)
    else:
        session.flush()
