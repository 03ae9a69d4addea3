"""Build small uncompressed magic-v2 record batches, sans-I/O.

kipside re-heads batches it did not write (protocol.records) and never re-encodes them. It writes
batches of its own only for its own bookkeeping records (the mirror's offset syncs), so this
builder is deliberately small: uncompressed, create-time timestamps, no control records.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import crc32c

from .primitives import write_varint

__all__ = ["Record", "encode_batch"]

_HEAD: Final = struct.Struct(">qiib")  # baseOffset, batchLength, partitionLeaderEpoch, magic
_COVERED: Final = struct.Struct(">hiqqqhii")  # attributes .. recordsCount
_UINT32: Final = struct.Struct(">I")
_LOG_OVERHEAD: Final = 12  # baseOffset and batchLength are not counted in batchLength


@dataclass(frozen=True, slots=True)
class Record:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_delta: int = 0


def _bytes_field(data: bytes | None) -> bytes:
    return write_varint(-1) if data is None else write_varint(len(data)) + data


def _record(record: Record, offset_delta: int) -> bytes:
    body = bytearray(b"\x00")  # attributes: unused
    body += write_varint(record.timestamp_delta) + write_varint(offset_delta)
    body += _bytes_field(record.key) + _bytes_field(record.value)
    body += write_varint(len(record.headers))
    for name, value in record.headers:
        raw = name.encode("utf-8")
        body += write_varint(len(raw)) + raw + _bytes_field(value)
    return write_varint(len(body)) + bytes(body)


def encode_batch(
    records: Sequence[Record],
    *,
    base_timestamp: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """One uncompressed batch holding `records` at offset deltas 0..n-1."""
    if not records:
        raise ValueError("a record batch needs at least one record")
    body = b"".join(_record(r, i) for i, r in enumerate(records))
    max_timestamp = base_timestamp + max(r.timestamp_delta for r in records)
    covered = _COVERED.pack(
        0,
        len(records) - 1,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    crc = crc32c.crc32c(body, crc32c.crc32c(covered))
    batch_length = _HEAD.size + 4 + len(covered) + len(body) - _LOG_OVERHEAD
    return _HEAD.pack(0, batch_length, -1, 2) + _UINT32.pack(crc) + covered + body
