"""ApiVersions: advertise what both the broker and kipside can handle.

For each API the broker lists, kipside advertises max = min(broker max, kipside max) and
min = max(broker min, kipside min), where kipside's range only exists for APIs it must decode
(today: the ones that carry broker addresses). Every other API, including keys kipside has never
heard of, passes through untouched. Produce keeps min 0 whatever happens (librdkafka breaks
otherwise, KAFKA-18659). ApiVersions itself is capped at v4: v5 carries ClusterId/NodeId.
A client asking for a newer ApiVersions than kipside knows gets UNSUPPORTED_VERSION in the v0
layout, as a broker would answer, and retries lower.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Final

from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsV0
from kio.static.primitive import i16

from kipside.protocol import (
    PRODUCE_MAX_VERSION,
    ApiKey,
    DecodeError,
    ErrorCode,
    Message,
    RequestHeader,
    ResponseHeader,
    build_frame,
    decode_response,
    encode_message,
    encode_response_header,
    known_versions,
)
from kipside.proxy.core.decisions import Answer, ClientRequest, Decision
from kipside.proxy.upstream.addresses import address_apis

log = logging.getLogger("kipside.versions")

MAX_API_VERSIONS_VERSION: Final = 4


def kipside_ranges() -> dict[int, tuple[int, int]]:
    """API key -> (min, max) versions kipside can serve, for the APIs it must decode."""
    ranges: dict[int, tuple[int, int]] = {}
    for api_key, first_decoded in address_apis().items():
        known = known_versions(api_key)
        if known is None:
            continue
        low, high = known
        # Versions below first_decoded are never decoded, so kio need not know them.
        ranges[api_key] = (0 if first_decoded > low else low, high)
    ranges[ApiKey.API_VERSIONS] = (0, MAX_API_VERSIONS_VERSION)
    # Produce v13 names topics by id, which the coalescer does not map.
    ranges[ApiKey.PRODUCE] = (0, PRODUCE_MAX_VERSION)
    return ranges


# KIP-890 part 2 switches clients (Java >= 4.0, franz-go) from AddPartitionsToTxn to implicit,
# server-side registration at transaction.version >= 2; kipside's transaction rules need the
# explicit calls, so it offers at most this level while transaction rules are configured.
TRANSACTION_VERSION_FEATURE: Final = "transaction.version"
MAX_TRANSACTION_VERSION_WITH_RULES: Final = 1


class VersionPolicy:
    api_keys = frozenset({ApiKey.API_VERSIONS})
    """The requests its stage (`__call__`) is asked about."""

    def __init__(
        self,
        ranges: dict[int, tuple[int, int]] | None = None,
        *,
        lower_transaction_version: bool = False,
        max_fetch_version: int | None = None,
    ) -> None:
        self.ranges = kipside_ranges() if ranges is None else ranges
        self.lower_transaction_version = lower_transaction_version
        if max_fetch_version is not None:
            # Rules that restrict topics read Fetch's topic names: v13+ names them by id.
            low, high = self.ranges.get(ApiKey.FETCH, (0, max_fetch_version))
            self.ranges[ApiKey.FETCH] = (low, min(high, max_fetch_version))

    def _lower_features(self, message: Message) -> Message:
        cap = MAX_TRANSACTION_VERSION_WITH_RULES
        if not hasattr(message, "finalized_features"):
            return message
        finalized = tuple(
            dataclasses.replace(
                f,
                max_version_level=i16(min(int(f.max_version_level), cap)),
                min_version_level=i16(min(int(f.min_version_level), cap)),
            )
            if f.name == TRANSACTION_VERSION_FEATURE
            else f
            for f in message.finalized_features
        )
        supported = tuple(
            dataclasses.replace(
                f, max_version=i16(max(min(int(f.max_version), cap), int(f.min_version)))
            )
            if f.name == TRANSACTION_VERSION_FEATURE
            else f
            for f in message.supported_features
        )
        return dataclasses.replace(
            message, finalized_features=finalized, supported_features=supported
        )

    def intersect(self, message: Message) -> Message:
        entries = []
        for entry in message.api_keys:
            mine = self.ranges.get(int(entry.api_key))
            if mine is None:
                entries.append(entry)
                continue
            low = max(int(entry.min_version), mine[0])
            high = min(int(entry.max_version), mine[1])
            if entry.api_key == ApiKey.PRODUCE:
                low = int(entry.min_version)
            if low > high:
                log.warning(
                    "broker offers api %d v%d-%d, kipside handles v%d-%d: not advertised",
                    entry.api_key,
                    entry.min_version,
                    entry.max_version,
                    *mine,
                )
                continue
            entries.append(dataclasses.replace(entry, min_version=i16(low), max_version=i16(high)))
        message = dataclasses.replace(message, api_keys=tuple(entries))
        if self.lower_transaction_version:
            message = self._lower_features(message)
        return message

    def rewrite_response(self, api_version: int, frame: bytes, header: ResponseHeader) -> bytes:
        # A broker answers an ApiVersions version it doesn't support with the v0 layout.
        try:
            message = decode_response(ApiKey.API_VERSIONS, api_version, frame, header.body_offset)
        except DecodeError as first:
            if api_version == 0:
                raise
            try:
                message = decode_response(ApiKey.API_VERSIONS, 0, frame, header.body_offset)
            except DecodeError as second:
                raise DecodeError(f"{first}; nor is it the v0 layout ({second})") from None
            api_version = 0
        body = encode_message(self.intersect(message))
        head = frame[4 : header.body_offset]
        return build_frame(head, body)

    def __call__(self, request: ClientRequest) -> Decision | None:
        """The versions stage: kipside's own answer to an ApiVersions newer than it knows."""
        header = request.header
        if header.api_key != ApiKey.API_VERSIONS:
            return None
        local = self.unsupported_answer(header)
        return None if local is None else Answer(local)

    def unsupported_answer(self, header: RequestHeader) -> bytes | None:
        """UNSUPPORTED_VERSION for an ApiVersions request newer than kipside's; else None."""
        if header.api_version <= MAX_API_VERSIONS_VERSION:
            return None
        return self.unsupported_response(header.correlation_id)

    def unsupported_response(self, correlation_id: int) -> bytes:
        """The v0-layout UNSUPPORTED_VERSION answer for an ApiVersions newer than kipside's."""
        message = ApiVersionsV0(
            error_code=ErrorCode.unsupported_version,
            api_keys=(
                ApiVersionV0(
                    api_key=i16(ApiKey.API_VERSIONS),
                    min_version=i16(0),
                    max_version=i16(MAX_API_VERSIONS_VERSION),
                ),
            ),
        )
        header = encode_response_header(ApiKey.API_VERSIONS, 0, correlation_id)
        return build_frame(header, encode_message(message))
