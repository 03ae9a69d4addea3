"""Scapy layers for Kafka frames: dissect a reassembled frame, or build one, malformed on purpose.

A frame is `int32 size` + header + body. KafkaRequest carries request header v1/v2 (api key,
version, correlation id, client id; v2 adds tagged fields: which one follows from the API
version, through kipside.protocol); KafkaResponse carries response header v0 (correlation id)
and KafkaResponseV1 adds tagged fields. Bodies stay Raw, except ProduceRequestBody for Produce
v3-v8 (the last versions before the compact encoding), whose counts and lengths are fields, so a
test can write any of them: a negative string length, an array of 2**31-1 topics.

Every length and count is a field that computes itself when left None and is written as given
otherwise: that is what makes these layers a kit for malformed frames (see craft.py). Decoding
for real goes through kipside.protocol (`KafkaRequest.message()`); these layers never replace it.

A capture's frames, reassembled, come from kipside.evidence's analysis; dissect_request and
dissect_response turn one into a layer, never raising: what does not dissect stays Raw.
"""

from __future__ import annotations

import struct
from typing import Any, ClassVar, Final

from scapy.fields import (
    AnyField,
    ConditionalField,
    EnumField,
    Field,
    FieldLenField,
    PacketListField,
    SignedIntField,
    SignedShortField,
    StrLenField,
)
from scapy.packet import Packet, Raw

from kipside.protocol import (
    ApiKey,
    Message,
    api_name,
    decode_request,
    parse_request_header,
    read_uvarint,
    request_header_version,
    response_header_version,
)

__all__ = [
    "API_NAMES",
    "KafkaRequest",
    "KafkaResponse",
    "KafkaResponseV1",
    "KafkaTaggedField",
    "ProducePartition",
    "ProduceRequestBody",
    "ProduceTopic",
    "dissect_request",
    "dissect_response",
]

API_NAMES: Final = {int(key): api_name(key) for key in ApiKey}
_MAX_ITEMS: Final = 1 << 20  # scapy's default list cap (100) is below a Produce of many partitions
_SIZE: Final = struct.Struct(">i")


class UVarIntField(FieldLenField):
    """Kafka's unsigned varint (KIP-482), optionally the length or count of another field."""

    def __init__(
        self,
        name: str,
        default: int | None,
        length_of: str | None = None,
        count_of: str | None = None,
        adjust: Any = lambda pkt, x: x,
    ) -> None:
        super().__init__(name, default, length_of=length_of, count_of=count_of, adjust=adjust)

    def addfield(self, pkt: Packet, s: bytes, val: int | None) -> bytes:
        value = self.i2m(pkt, val)
        out = bytearray()
        while value > 0x7F:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
        return s + bytes(out)

    def getfield(self, pkt: Packet, s: bytes) -> tuple[bytes, int]:
        value, offset = read_uvarint(s, 0)
        return s[offset:], value

    def i2len(self, pkt: Packet, x: Any) -> int:
        return len(self.addfield(pkt, b"", x))


class _Item(Packet):
    """An item of a Kafka array: the bytes after it belong to the next item (scapy would make
    them this item's payload)."""

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s


class KafkaTaggedField(_Item):
    """One field of a tagged-field section: tag, size, bytes."""

    name = "Kafka tagged field"
    fields_desc: ClassVar[list[AnyField]] = [
        UVarIntField("tag", 0),
        UVarIntField("size", None, length_of="data"),
        StrLenField("data", b"", length_from=lambda p: p.size),
    ]


def _tag_fields(condition: Any) -> list[AnyField]:
    return [
        ConditionalField(UVarIntField("tag_count", None, count_of="tags"), condition),
        ConditionalField(
            PacketListField(
                "tags",
                [],
                KafkaTaggedField,
                count_from=lambda p: p.tag_count,
                max_count=_MAX_ITEMS,
            ),
            condition,
        ),
    ]


class _Frame(Packet):
    """A size-prefixed frame: `size` counts every byte after itself unless set."""

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.size is None:
            pkt = _SIZE.pack(len(pkt) + len(pay) - 4) + pkt[4:]
        return pkt + pay

    def body(self) -> bytes:
        """The bytes after the header (the message body)."""
        return bytes(self.payload)


def _flexible_request(pkt: Packet) -> bool:
    try:
        return request_header_version(pkt.api_key, pkt.api_version) >= 2
    except (TypeError, ValueError):
        return False


class KafkaRequest(_Frame):
    """A request frame: size, request header v1 or v2 (v2 when the API version is flexible)."""

    name = "Kafka request"
    fields_desc: ClassVar[list[AnyField]] = [
        Field("size", None, "!i"),
        EnumField("api_key", int(ApiKey.API_VERSIONS), API_NAMES, fmt="!h"),
        SignedShortField("api_version", 0),
        SignedIntField("correlation_id", 0),
        FieldLenField("client_id_length", None, length_of="client_id", fmt="!h"),
        StrLenField("client_id", b"kipside", length_from=lambda p: max(p.client_id_length, 0)),
        *_tag_fields(_flexible_request),
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        if self.api_key == ApiKey.PRODUCE and 3 <= self.api_version <= 8:
            return ProduceRequestBody
        return Raw

    def mysummary(self) -> str:
        return self.sprintf(
            "Kafka %KafkaRequest.api_key% v%KafkaRequest.api_version% request "
            "(correlation id %KafkaRequest.correlation_id%)"
        )

    def message(self) -> Message:
        """The request decoded by kipside.protocol (kio's classes); DecodeError if it can't be."""
        frame = bytes(self)
        header = parse_request_header(frame)
        return decode_request(header.api_key, header.api_version, frame, header.body_offset)


class KafkaResponse(_Frame):
    """A response frame with response header v0 (correlation id only)."""

    name = "Kafka response"
    fields_desc: ClassVar[list[AnyField]] = [
        Field("size", None, "!i"),
        SignedIntField("correlation_id", 0),
    ]

    def mysummary(self) -> str:
        return self.sprintf("Kafka response (correlation id %correlation_id%)")


class KafkaResponseV1(KafkaResponse):
    """A response frame with response header v1 (correlation id, tagged fields)."""

    name = "Kafka response (header v1)"
    fields_desc: ClassVar[list[AnyField]] = [
        Field("size", None, "!i"),
        SignedIntField("correlation_id", 0),
        *_tag_fields(lambda p: True),
    ]


def _array(count: str, name: str, item: type[Packet]) -> list[AnyField]:
    """A Kafka array of non-flexible versions: its int32 count (field `count`), then the items."""
    return [
        FieldLenField(count, None, count_of=name, fmt="!i"),
        PacketListField(
            name, [], item, count_from=lambda p: getattr(p, count), max_count=_MAX_ITEMS
        ),
    ]


class ProducePartition(_Item):
    """One partition of a ProduceRequest v3-v8: index, records (int32 length, -1 for null)."""

    name = "Produce partition"
    fields_desc: ClassVar[list[AnyField]] = [
        SignedIntField("index", 0),
        FieldLenField("records_length", None, length_of="records", fmt="!i"),
        StrLenField("records", b"", length_from=lambda p: max(p.records_length, 0)),
    ]


class ProduceTopic(_Item):
    """One topic of a ProduceRequest v3-v8: name (int16 length), partitions (int32 count)."""

    name = "Produce topic"
    fields_desc: ClassVar[list[AnyField]] = [
        FieldLenField("name_length", None, length_of="topic", fmt="!h"),
        StrLenField("topic", b"", length_from=lambda p: max(p.name_length, 0)),
        *_array("partition_count", "partitions", ProducePartition),
    ]


class ProduceRequestBody(Packet):
    """A ProduceRequest body, v3-v8: transactional id, acks, timeout, topics."""

    name = "Produce request body"
    fields_desc: ClassVar[list[AnyField]] = [
        FieldLenField(
            "transactional_id_length",
            None,
            length_of="transactional_id",
            fmt="!h",
            adjust=lambda p, n: n if p.transactional_id else -1,  # empty: null
        ),
        StrLenField(
            "transactional_id",
            b"",
            length_from=lambda p: max(p.transactional_id_length, 0),
        ),
        SignedShortField("acks", -1),
        SignedIntField("timeout_ms", 30000),
        *_array("topic_count", "topics", ProduceTopic),
    ]


def dissect_request(frame: bytes) -> Packet:
    """A request frame (size prefix included) as a KafkaRequest; Raw if it cannot be one."""
    try:
        return KafkaRequest(frame)
    except Exception:  # scapy raises what its fields raise; a capture may hold anything
        return Raw(frame)


def dissect_response(frame: bytes, api_key: int, api_version: int) -> Packet:
    """A response frame as KafkaResponse or KafkaResponseV1, as its request's API version
    says; Raw if it cannot be one."""
    try:
        layer = KafkaResponseV1 if response_header_version(api_key, api_version) else KafkaResponse
        return layer(frame)
    except Exception:  # as dissect_request
        return Raw(frame)
