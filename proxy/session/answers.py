"""What a session owes its client: one slot per request that expects an answer, in request
order, and the rewrites a broker's raw answer needs before the client may see it (broker
addresses to kipside's, ApiVersions to what kipside supports, a SaslHandshake's outcome).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry.trace import Span

from kipside.protocol import ApiKey, DecodeError, api_name, parse_response_header
from kipside.proxy.core.answers import Pending
from kipside.proxy.security import ClientSasl
from kipside.proxy.stages.hooks import ApiVersionsPolicy
from kipside.proxy.upstream.addresses import AddressRewriter, carries_addresses

__all__ = ["DRAINED", "REFUSED", "UPSTREAM_GONE", "Marker", "Slot", "rewrite_answer"]

log = logging.getLogger("kipside.session")


@dataclass(slots=True)
class Slot:
    """A response the client is owed, in request order."""

    api_key: int
    api_version: int
    correlation_id: int
    pending: Pending
    # Raw upstream responses still need kipside's rewrites; locally built ones don't.
    raw: bool
    started: float
    span: Span | None
    # The principals rules let part of the request through: the broker's answer to that part
    # becomes the client's (refused partitions added) before any rewrite.
    merge: Callable[[bytes], bytes] | None = None
    request_bytes: int = 0
    """Bytes of the request, held (network.limits) until the answer is written."""
    answer_bytes: int = 0
    """Bytes of the answer as it came, held from then until it is written."""


@dataclass(frozen=True, slots=True)
class Marker:
    """A point in the slot queue after which no response will be owed."""

    reason: str


# The client's own upstream connection ended: nothing after this point can be answered.
UPSTREAM_GONE = Marker("upstream gone")
# The session is draining for shutdown: no requests were read after this point.
DRAINED = Marker("drained")
# kipside refused the client (SASL): close once the answers before this point are written.
REFUSED = Marker("refused")


def rewrite_answer(
    slot: Slot,
    frame: bytes,
    versions: ApiVersionsPolicy,
    rewriter: AddressRewriter,
    sasl: ClientSasl,
    who: str,
) -> bytes | None:
    """The answer as the client must see it (a raw one is the broker's: rewritten; a merged
    one gets the refused partitions first); None if it can't be rewritten (logged: the session
    closes rather than pass a broker address through)."""
    if slot.merge is not None:
        try:
            frame = slot.merge(frame)
        except DecodeError as exc:
            log.error(
                "%s: cannot read the broker's %s v%d answer to add the partitions the "
                "principals rules refused (%s); closing the connection",
                who,
                api_name(slot.api_key),
                slot.api_version,
                exc,
            )
            return None
    if not slot.raw:
        return frame
    try:
        if slot.api_key == ApiKey.SASL_HANDSHAKE:
            sasl.broker_answered(slot.api_key, slot.api_version, frame)
            return frame
        if slot.api_key == ApiKey.API_VERSIONS:
            header = parse_response_header(frame, slot.api_key, slot.api_version)
            return versions.rewrite_response(slot.api_version, frame, header)
        if carries_addresses(slot.api_key, slot.api_version):
            header = parse_response_header(frame, slot.api_key, slot.api_version)
            return rewriter.rewrite(slot.api_key, slot.api_version, frame, header)
    except DecodeError as exc:
        log.error(
            "%s: the broker's %s v%d answer cannot be read (%s); kipside never passes broker "
            "addresses through, so the connection is closed. If the broker is a real Kafka "
            "broker, report this with its version",
            who,
            api_name(slot.api_key),
            slot.api_version,
            exc,
        )
        return None
    return frame
