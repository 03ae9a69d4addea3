"""Zero-copy views of Kafka magic-v2 RecordBatch headers.

This module reads and re-heads the fixed 61-byte header that precedes every
magic-v2 record batch in Produce requests and Fetch responses, so the proxy can
route, account for and re-produce batches without understanding their contents.

It must never decompress or decode the records that follow the header: the
batch body is opaque payload, carried as a memoryview slice of the caller's
buffer. It is sans-I/O: it must never import trio or anything from ``proxy``.

A view holds a buffer export on the caller's object; a ``bytearray`` cannot be
resized while any view (or any slice taken from ``raw``) is alive.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

import crc32c

from .primitives import Buffer

__all__ = [
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "MIN_BATCH_LENGTH",
    "Compression",
    "ControlType",
    "RecordBatchError",
    "RecordBatchView",
    "TimestampType",
    "as_plain_producer",
    "batch_extent",
    "control_type",
    "count_batches",
    "count_batches_in",
    "iter_batches",
    "restamp",
]


class RecordBatchError(ValueError):
    """The peer sent a malformed record batch; the message says what and where."""


class Compression(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class ControlType(IntEnum):
    """The type in a control record's key (Kafka's ControlRecordType). Only ABORT and COMMIT
    end transactions; the others belong to KRaft's own logs, and readers skip them."""

    UNKNOWN = -1
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes,
# lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch,
# baseSequence, recordsCount.
_HEADER: Final = struct.Struct(">qiibIhiqqqhii")
# The CRC-covered part of the header that as_plain_producer rewrites wholesale.
_CRC_COVERED_HEADER: Final = struct.Struct(">hiqqqhii")
_INT32: Final = struct.Struct(">i")
_INT64: Final = struct.Struct(">q")
_CONTROL_KEY: Final = struct.Struct(">hh")  # version, type
_UINT32: Final = struct.Struct(">I")

HEADER_SIZE: Final = _HEADER.size
# batchLength does not count baseOffset or itself.
LOG_OVERHEAD: Final = 12
MIN_BATCH_LENGTH: Final = HEADER_SIZE - LOG_OVERHEAD

_BATCH_LENGTH_OFFSET: Final = 8
_MAGIC_OFFSET: Final = 16
_CRC_OFFSET: Final = 17
_ATTRIBUTES_OFFSET: Final = 21
_LAST_OFFSET_DELTA_OFFSET: Final = 23
_LAST_OFFSET_DELTA_END: Final = 27
# Legacy message sets put magic at the same position, so one byte is enough to
# tell the formats apart before trusting anything else in the header.
_MAGIC_VISIBLE: Final = _MAGIC_OFFSET + 1

_CODEC_MASK: Final = 0x07
_TIMESTAMP_TYPE_BIT: Final = 0x08
_TRANSACTIONAL_BIT: Final = 0x10
_CONTROL_BIT: Final = 0x20
_DELETE_HORIZON_BIT: Final = 0x40

_HeaderTuple = tuple[int, int, int, int, int, int, int, int, int, int, int, int, int]


def _byte_view(buffer: Buffer) -> memoryview:
    view = memoryview(buffer)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


@dataclass(frozen=True, slots=True)
class RecordBatchView:
    """One complete magic-v2 record batch, viewed in place.

    Build it with :meth:`from_buffer`; the dataclass constructor skips validation.
    """

    raw: memoryview
    """The whole batch, header included: exactly ``size`` bytes."""
    _header: _HeaderTuple = field(repr=False, compare=False)

    @classmethod
    def from_buffer(cls, buffer: Buffer, offset: int = 0) -> RecordBatchView:
        """Validate and view the batch starting at ``offset`` in ``buffer``.

        Error messages give byte positions relative to the start of ``buffer``.
        """
        view = _byte_view(buffer)
        available = len(view) - offset
        if offset < 0 or available < 0:
            raise RecordBatchError(
                f"record batch offset {offset} is outside the {len(view)}-byte buffer"
            )
        if available < _MAGIC_VISIBLE:
            raise RecordBatchError(
                f"truncated record batch header at byte {offset}: "
                f"need {HEADER_SIZE} bytes, only {available} available"
            )
        magic = view[offset + _MAGIC_OFFSET]
        if magic != 2:
            raise RecordBatchError(
                f"unsupported magic {magic} at byte {offset + _MAGIC_OFFSET}: only magic 2 "
                "record batches are supported (magic 0 and 1 are legacy message sets)"
            )
        batch_length: int = _INT32.unpack_from(view, offset + _BATCH_LENGTH_OFFSET)[0]
        if batch_length < MIN_BATCH_LENGTH:
            raise RecordBatchError(
                f"invalid batchLength {batch_length} at byte {offset + _BATCH_LENGTH_OFFSET}: "
                f"a magic 2 batch needs at least {MIN_BATCH_LENGTH}"
            )
        if available < HEADER_SIZE:
            raise RecordBatchError(
                f"truncated record batch header at byte {offset}: "
                f"need {HEADER_SIZE} bytes, only {available} available"
            )
        size = LOG_OVERHEAD + batch_length
        if available < size:
            raise RecordBatchError(
                f"batchLength {batch_length} at byte {offset + _BATCH_LENGTH_OFFSET} runs past "
                f"the end of the buffer: batch needs {size} bytes, only {available} available"
            )
        header: _HeaderTuple = _HEADER.unpack_from(view, offset)
        codec = header[5] & _CODEC_MASK
        if codec > Compression.ZSTD:
            # Checked here so the compression property can never fail later.
            raise RecordBatchError(
                f"unknown compression codec {codec} in attributes 0x{header[5] & 0xFFFF:04x} "
                f"at byte {offset + _ATTRIBUTES_OFFSET}"
            )
        return cls(view[offset : offset + size], header)

    @property
    def base_offset(self) -> int:
        return self._header[0]

    @property
    def batch_length(self) -> int:
        return self._header[1]

    @property
    def partition_leader_epoch(self) -> int:
        return self._header[2]

    @property
    def magic(self) -> int:
        return self._header[3]

    @property
    def crc(self) -> int:
        return self._header[4]

    @property
    def attributes(self) -> int:
        return self._header[5]

    @property
    def compression(self) -> Compression:
        return Compression(self._header[5] & _CODEC_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType(1 if self._header[5] & _TIMESTAMP_TYPE_BIT else 0)

    @property
    def is_transactional(self) -> bool:
        return bool(self._header[5] & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self._header[5] & _CONTROL_BIT)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self._header[5] & _DELETE_HORIZON_BIT)

    @property
    def last_offset_delta(self) -> int:
        return self._header[6]

    @property
    def base_timestamp(self) -> int:
        return self._header[7]

    @property
    def max_timestamp(self) -> int:
        return self._header[8]

    @property
    def producer_id(self) -> int:
        return self._header[9]

    @property
    def producer_epoch(self) -> int:
        return self._header[10]

    @property
    def base_sequence(self) -> int:
        return self._header[11]

    @property
    def records_count(self) -> int:
        return self._header[12]

    @property
    def size(self) -> int:
        """Total bytes of the batch, header included."""
        return len(self.raw)

    @property
    def records(self) -> memoryview:
        """The (possibly compressed) records section, undecoded."""
        return self.raw[HEADER_SIZE:]

    def compute_crc(self) -> int:
        """CRC-32C of attributes through the end of the batch, as the wire CRC should be."""
        return crc32c.crc32c(self.raw[_ATTRIBUTES_OFFSET:])

    def crc_valid(self) -> bool:
        return self.compute_crc() == self.crc


def batch_extent(buffer: Buffer) -> tuple[int, int, int] | None:
    """(base offset, size in bytes, offsets spanned) of the batch starting the buffer, read from
    its header even when the rest was cut off; None when not even that much is there."""
    view = _byte_view(buffer)
    if len(view) < _LAST_OFFSET_DELTA_END or view[_MAGIC_OFFSET] != 2:
        return None
    base_offset: int = _INT64.unpack_from(view, 0)[0]
    batch_length: int = _INT32.unpack_from(view, _BATCH_LENGTH_OFFSET)[0]
    last_offset_delta: int = _INT32.unpack_from(view, _LAST_OFFSET_DELTA_OFFSET)[0]
    if batch_length < MIN_BATCH_LENGTH or last_offset_delta < 0:
        return None
    return base_offset, LOG_OVERHEAD + batch_length, last_offset_delta + 1


def _is_partial_tail(view: memoryview, pos: int) -> bool:
    """True when the bytes at ``pos`` look like a batch that was cut short.

    Bytes that are present but wrong (bad magic, impossible batchLength) are not a
    tail cut; they are left for from_buffer to reject.
    """
    available = len(view) - pos
    if available < LOG_OVERHEAD:
        return True
    batch_length: int = _INT32.unpack_from(view, pos + _BATCH_LENGTH_OFFSET)[0]
    if batch_length < MIN_BATCH_LENGTH:
        return False
    if available >= _MAGIC_VISIBLE and view[pos + _MAGIC_OFFSET] != 2:
        return False
    return available < LOG_OVERHEAD + batch_length


def iter_batches(records: Buffer, *, allow_partial_tail: bool = False) -> Iterator[RecordBatchView]:
    """Yield a view of each batch in a records blob, front to back.

    Fetch responses may end with a batch the broker cut at the fetch size limit;
    pass ``allow_partial_tail=True`` to stop quietly there instead of raising.
    Produce requests have no such excuse, hence the strict default.
    """
    view = _byte_view(records)
    end = len(view)
    pos = 0
    while pos < end:
        if allow_partial_tail and _is_partial_tail(view, pos):
            return
        batch = RecordBatchView.from_buffer(view, pos)
        yield batch
        pos += batch.size


_RECORDS_COUNT_OFFSET: Final = HEADER_SIZE - 4


def count_batches(records: Buffer) -> tuple[int, int, int]:
    """(batches, records, corrupt batches) of a records blob, as iter_batches would find them
    but without a view per batch: readers of packet captures count hundreds of thousands of
    requests. A batch whose CRC-32C does not match its bytes is corrupt and its records are not
    counted (its count field can't be trusted). Raises RecordBatchError as iter_batches does."""
    view = _byte_view(records)
    return count_batches_in(view, 0, len(view))


def count_batches_in(view: memoryview, start: int, end: int) -> tuple[int, int, int]:
    """count_batches of the bytes view[start:end] of a byte view."""
    pos, batches, count, corrupt = start, 0, 0, 0
    while pos < end:
        if end - pos < HEADER_SIZE or view[pos + _MAGIC_OFFSET] != 2:
            RecordBatchView.from_buffer(view[start:end], pos - start)  # raises what is wrong
        size = LOG_OVERHEAD + _INT32.unpack_from(view, pos + _BATCH_LENGTH_OFFSET)[0]
        if size < HEADER_SIZE or pos + size > end:
            RecordBatchView.from_buffer(view[start:end], pos - start)
        batches += 1
        crc = _UINT32.unpack_from(view, pos + _CRC_OFFSET)[0]
        if crc32c.crc32c(view[pos + _ATTRIBUTES_OFFSET : pos + size]) == crc:
            count += _INT32.unpack_from(view, pos + _RECORDS_COUNT_OFFSET)[0]
        else:
            corrupt += 1
        pos += size
    return batches, count, corrupt


def restamp(
    batch: RecordBatchView,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    *,
    transactional: bool = False,
) -> tuple[bytes, memoryview]:
    """``batch`` re-headed for another producer, as (new header, untouched records).

    producerId, producerEpoch and baseSequence take the given values (-1 for a plain producer),
    the transactional bit is set as asked (cleared by default: the batch leaves the source's
    transaction) and the CRC is recomputed; compression and the records
    bytes are kept, and the records come back as the same memoryview so they are never copied.
    baseOffset and partitionLeaderEpoch are left as they are: the broker assigns both.
    """
    if batch.is_control:
        raise RecordBatchError(
            f"refusing to re-produce a control batch (attributes 0x{batch.attributes & 0xFFFF:04x} "
            f"at byte {_ATTRIBUTES_OFFSET} of the batch): only brokers may write control records"
        )
    attributes = batch.attributes & ~_TRANSACTIONAL_BIT
    covered_header = _CRC_COVERED_HEADER.pack(
        attributes | _TRANSACTIONAL_BIT if transactional else attributes,
        batch.last_offset_delta,
        batch.base_timestamp,
        batch.max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        batch.records_count,
    )
    body = batch.records
    # Chaining the CRC avoids concatenating the records just to checksum them.
    crc = crc32c.crc32c(body, crc32c.crc32c(covered_header))
    return b"".join((batch.raw[:_CRC_OFFSET], _UINT32.pack(crc), covered_header)), body


def as_plain_producer(batch: RecordBatchView) -> bytes:
    """Copy ``batch`` re-headed as if sent by a plain (non-idempotent) producer (see restamp)."""
    header, body = restamp(batch, -1, -1, -1)
    return header + bytes(body)


def control_type(batch: RecordBatchView) -> ControlType:
    """How the transaction ended, from a control batch's one record's key (version, type).

    Control batches are never compressed; the record is length, attributes, timestampDelta,
    offsetDelta (varints), then the key. Raises RecordBatchError on anything else.
    """
    where = f"control batch at offset {batch.base_offset}"
    if not batch.is_control:
        raise RecordBatchError(f"batch at offset {batch.base_offset} is not a control batch")
    if batch.compression != Compression.NONE or batch.records_count < 1:
        raise RecordBatchError(f"{where} is compressed or empty")
    records = batch.records
    pos = 0
    _length, pos = _read_varint(records, pos, where)
    pos += 1  # attributes: one unused byte
    _timestamp_delta, pos = _read_varint(records, pos, where)
    _offset_delta, pos = _read_varint(records, pos, where)
    key_length, pos = _read_varint(records, pos, where)
    if key_length < 4 or pos + 4 > len(records):
        raise RecordBatchError(f"{where} has a {key_length}-byte key; a control key has 4")
    kind: int = _CONTROL_KEY.unpack_from(records, pos)[1]
    try:
        return ControlType(kind)
    except ValueError:
        return ControlType.UNKNOWN  # a newer Kafka's type: skipped, as Java's consumer does


def _read_varint(buf: memoryview, pos: int, where: str) -> tuple[int, int]:
    """A zigzag varint (record fields are signed)."""
    value = 0
    shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise RecordBatchError(f"{where}: truncated varint at byte {pos} of the records")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
