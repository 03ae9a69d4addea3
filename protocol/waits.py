"""How long a request may keep its broker busy by its own terms, read without decoding it.

A broker may hold some requests before answering: a ProduceRequest up to its timeout_ms (for
acks=all), a Fetch up to its max_wait_ms (a long poll), a JoinGroup until the group's rebalance
completes (its rebalance_timeout_ms, or session_timeout_ms in v0). Whoever times out waiting
for an answer (a proxy, like a client's request.timeout.ms) must allow that much; Apache Kafka's
own clients allow a JoinGroup its rebalance timeout the same way.
"""

from __future__ import annotations

from .apis import ApiKey
from .errors import DecodeError
from .headers import RequestHeader
from .primitives import Buffer, read_int16, read_int32, read_uvarint
from .produce import produce_acks_offset

__all__ = ["request_allowance_ms"]


def request_allowance_ms(frame: Buffer, header: RequestHeader) -> int:
    """Milliseconds the broker may take to answer this request by its own terms (0 for a
    request it answers at once, or one too short to read)."""
    try:
        api_key, version, offset = header.api_key, header.api_version, header.body_offset
        if api_key == ApiKey.PRODUCE:
            offset = produce_acks_offset(frame, offset, version)
            return max(read_int32(frame, offset + 2)[0], 0)  # after acks
        if api_key == ApiKey.FETCH:
            if version < 15:
                offset += 4  # replica_id
            return max(read_int32(frame, offset)[0], 0)
        if api_key == ApiKey.JOIN_GROUP:
            if version >= 6:
                length, offset = read_uvarint(frame, offset)
                offset += max(length - 1, 0)
            else:
                length, offset = read_int16(frame, offset)
                offset += max(length, 0)
            session_ms, offset = read_int32(frame, offset)
            if version == 0:
                return max(session_ms, 0)
            return max(read_int32(frame, offset)[0], session_ms, 0)
    except (DecodeError, IndexError, ValueError):
        return 0
    return 0
