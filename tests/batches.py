"""Record batches for tests, with every header field chosen: data batches and control batches.

Control batches are written out by hand from Kafka's format (DefaultRecordBatch /
ControlRecordType / EndTransactionMarker in Apache Kafka's clients), not through any code under
test, so the decoders in protocol/ are checked against the format and not against themselves.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import crc32c

from kipside.protocol import RecordBatchView
from kipside.protocol.batch_builder import Record, encode_batch

TRANSACTIONAL: Final = 0x10
CONTROL: Final = 0x20
ABORT: Final = 0
COMMIT: Final = 1
TIMESTAMP: Final = 1_700_000_000_000

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, then the CRC-covered fields:
# attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch,
# baseSequence, recordsCount.
_HEAD: Final = struct.Struct(">qiib")
_COVERED: Final = struct.Struct(">hiqqqhii")
_HEADER_SIZE: Final = 61


@dataclass(frozen=True)
class Header:
    """The fields of a magic-v2 batch header a test chooses (the length and CRC are computed)."""

    # In the order they are on the wire.
    base_offset: int = 0
    leader_epoch: int = -1
    attributes: int = 0
    last_offset_delta: int = 0
    base_timestamp: int = TIMESTAMP
    max_timestamp: int = TIMESTAMP
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    records_count: int = 1

    def around(self, records: bytes) -> bytes:
        """A batch with this header around already encoded `records`, with a correct CRC-32C."""
        covered = _COVERED.pack(
            self.attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.records_count,
        )
        crc = crc32c.crc32c(covered + records)
        batch_length = _HEADER_SIZE - 12 + len(records)
        head = _HEAD.pack(self.base_offset, batch_length, self.leader_epoch, 2)
        return head + struct.pack(">I", crc) + covered + records


def control_record(kind: int, coordinator_epoch: int = 0, *, key_version: int = 0) -> bytes:
    """The one record of a transaction marker batch, byte by byte."""
    key = struct.pack(">hh", key_version, kind)  # ControlRecordType key: version, type
    value = struct.pack(">hi", 0, coordinator_epoch)  # EndTransactionMarker: version, epoch
    body = (
        b"\x00"  # attributes (int8, unused)
        b"\x00"  # timestampDelta (varlong 0)
        b"\x00"  # offsetDelta (varint 0)
        + b"\x08"  # key length 4 (zigzag varint)
        + key
        + b"\x0c"  # value length 6
        + value
        + b"\x00"  # no headers
    )
    assert len(body) == 16
    return b"\x20" + body  # record length 16 (zigzag varint)


def control_batch(
    kind: int,
    *,
    producer_id: int,
    producer_epoch: int = 0,
    base_offset: int = 0,
    coordinator_epoch: int = 0,
) -> bytes:
    """A COMMIT or ABORT marker as a broker writes it: transactional and control bits set."""
    header = Header(
        base_offset=base_offset,
        attributes=TRANSACTIONAL | CONTROL,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
    )
    return header.around(control_record(kind, coordinator_epoch))


def data_batch(
    *,
    base_offset: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    values: tuple[bytes, ...] = (b"v",),
) -> bytes:
    """A data batch of one record per value, re-headed with the producer fields given."""
    built = encode_batch([Record(b"k", v) for v in values], base_timestamp=TIMESTAMP)
    header = Header(
        records_count=len(values),
        base_offset=base_offset,
        attributes=TRANSACTIONAL if transactional else 0,
        last_offset_delta=len(values) - 1,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )
    return header.around(built[_HEADER_SIZE:])


# What re-stamping a batch's producer (or stripping it) must leave as it was.
_NOT_THE_PRODUCER: Final = (
    "base_offset",
    "batch_length",
    "partition_leader_epoch",
    "last_offset_delta",
    "base_timestamp",
    "max_timestamp",
    "records_count",
    "timestamp_type",
)


def assert_same_but_producer(new: RecordBatchView, old: RecordBatchView) -> None:
    """Every header field of `new` that does not name the producer is as in `old`."""
    for name in _NOT_THE_PRODUCER:
        assert getattr(new, name) == getattr(old, name), name
