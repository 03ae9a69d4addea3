"""Kafka's primitive encodings that kipside reads by hand on its hot paths.

Only what headers and hand-parsed messages need: fixed-width ints, varints, legacy and compact
strings and array lengths (`flexible` picks the compact form of KIP-482), tagged-field sections.
Everything else is read through protocol.messages (kio). Raises DecodeError on truncated or
malformed input; never does I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from .errors import DecodeError, LimitExceeded

INT8: Final = struct.Struct(">b")
INT16: Final = struct.Struct(">h")
INT32: Final = struct.Struct(">i")
INT64: Final = struct.Struct(">q")
UINT32: Final = struct.Struct(">I")

Buffer = bytes | bytearray | memoryview
"""Bytes as the codec reads them and a connection writes them: a frame, a chunk of one, or a
zero-copy view into one."""


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Caps a reader applies to what a peer declares, beyond the bytes it sent (which every
    reader checks anyway): a hostile frame of 100 MiB of empty tagged fields or empty topics is
    valid Kafka and would cost tens of seconds of CPU to walk. Passing one raises
    LimitExceeded naming the field. The proxy fills them from its rule file's ``limits``."""

    max_tagged_fields: int
    """Fields in one tagged-field section."""
    max_tagged_field_bytes: int
    """Bytes of one tagged field."""
    max_partitions: int
    """Topics in one request, and partitions over all its topics."""


def read_uvarint(buf: Buffer, offset: int) -> tuple[int, int]:
    """Read an unsigned varint; return (value, offset after it)."""
    end = len(buf)
    if offset < end:
        byte = buf[offset]
        if byte < 0x80:  # the usual case: lengths and counts under 128
            return byte, offset + 1
    value = 0
    shift = 0
    while True:
        if offset >= end:
            raise DecodeError("truncated unsigned varint")
        byte = buf[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7
        if shift > 28:
            raise DecodeError("unsigned varint longer than 5 bytes")


def write_uvarint(value: int) -> bytes:
    if value < 0:
        raise ValueError("unsigned varint cannot be negative")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def write_varint(value: int) -> bytes:
    """A zigzag (signed) varint, as a record's fields are written."""
    return write_uvarint((value << 1) ^ (value >> 63))


def read_int16(buf: Buffer, offset: int) -> tuple[int, int]:
    if offset + 2 > len(buf):
        raise DecodeError("truncated int16")
    return INT16.unpack_from(buf, offset)[0], offset + 2


def read_int32(buf: Buffer, offset: int) -> tuple[int, int]:
    if offset + 4 > len(buf):
        raise DecodeError("truncated int32")
    return INT32.unpack_from(buf, offset)[0], offset + 4


def read_nullable_string(buf: Buffer, offset: int) -> tuple[str | None, int]:
    """A legacy (int16-length) nullable string."""
    length, offset = read_int16(buf, offset)
    if length < 0:
        return None, offset
    end = offset + length
    if end > len(buf):
        raise DecodeError("truncated string")
    return bytes(buf[offset:end]).decode("utf-8", errors="replace"), end


def read_compact_nullable_string(buf: Buffer, offset: int) -> tuple[str | None, int]:
    length, offset = read_uvarint(buf, offset)
    if length == 0:
        return None, offset
    end = offset + length - 1
    if end > len(buf):
        raise DecodeError("truncated compact string")
    return bytes(buf[offset:end]).decode("utf-8", errors="replace"), end


def read_string(buf: Buffer, offset: int, flexible: bool) -> tuple[str | None, int]:
    """A nullable string: compact in a flexible version, legacy otherwise."""
    if flexible:
        return read_compact_nullable_string(buf, offset)
    return read_nullable_string(buf, offset)


def write_string(value: str | None, flexible: bool) -> bytes:
    """A nullable string: compact in a flexible version, legacy otherwise."""
    if value is None:
        return b"\x00" if flexible else INT16.pack(-1)
    raw = value.encode("utf-8")
    return (write_uvarint(len(raw) + 1) if flexible else INT16.pack(len(raw))) + raw


def read_array_length(buf: Buffer, offset: int, flexible: bool) -> tuple[int, int]:
    """An array's length (-1 for null): compact in a flexible version, int32 otherwise."""
    if flexible:
        length, offset = read_uvarint(buf, offset)
        return length - 1, offset
    return read_int32(buf, offset)


read_bytes_length = read_array_length
"""A nullable byte string's length (-1 for null), such as a partition's records: Kafka writes it
exactly as it writes an array's."""


def write_array_length(length: int, flexible: bool) -> bytes:
    """An array's length: compact in a flexible version, int32 otherwise."""
    return write_uvarint(length + 1) if flexible else INT32.pack(length)


def iter_tagged_fields(buf: Buffer, offset: int) -> Iterator[tuple[int, int, int]]:
    """Yield (tag, start, end) for each field of a tagged-field section starting at offset.

    Unknown tags are skipped by size, as the protocol requires. The offset after the section is
    the `end` of the last field (or the offset after the count when there are none); use
    `skip_tagged_fields` when only that is needed.
    """
    count, offset = read_uvarint(buf, offset)
    for _ in range(count):
        tag, offset = read_uvarint(buf, offset)
        size, offset = read_uvarint(buf, offset)
        end = offset + size
        if end > len(buf):
            raise DecodeError(f"tagged field {tag} runs past the end of the message")
        yield tag, offset, end
        offset = end


def has_tagged_field(buf: Buffer, offset: int, wanted: int) -> bool:
    """Whether the tagged-field section starting at offset holds tag `wanted`."""
    return any(tag == wanted for tag, _start, _end in iter_tagged_fields(buf, offset))


def skip_tagged_fields(buf: Buffer, offset: int, limits: DecodeLimits | None = None) -> int:
    if offset < len(buf) and buf[offset] == 0:  # the usual case: no tagged fields
        return offset + 1
    count, offset = read_uvarint(buf, offset)
    if limits is not None and count > limits.max_tagged_fields:
        raise LimitExceeded(
            f"{count} tagged fields in one section, over the cap of {limits.max_tagged_fields}",
            limit="max_tagged_fields",
            value=count,
            cap=limits.max_tagged_fields,
        )
    for _ in range(count):
        tag, offset = read_uvarint(buf, offset)
        size, offset = read_uvarint(buf, offset)
        if limits is not None and size > limits.max_tagged_field_bytes:
            raise LimitExceeded(
                f"tagged field {tag} of {size} bytes, over the cap of "
                f"{limits.max_tagged_field_bytes}",
                limit="max_tagged_field_bytes",
                value=size,
                cap=limits.max_tagged_field_bytes,
            )
        offset += size
        if offset > len(buf):
            raise DecodeError("tagged field runs past the end of the message")
    return offset
