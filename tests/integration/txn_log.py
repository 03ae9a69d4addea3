"""A partition's log read straight from the broker and resolved by hand, the way
read_committed is specified.

Tansu 0.6.0 sends no AbortedTransactions in Fetch responses, so its read_committed consumers
also return aborted records (a broker limitation, seen without kipside;
test_clients_transactions.py). The transaction tests therefore read every record with its
producer id, and the commit/abort control markers, over a plain socket (read_uncommitted), and
apply the markers themselves.
Used by the transaction tests (test_transactions_*.py), test_cluster_transactions.py and
fault_kit's audit. It never goes through kipside: pass it the broker's (or relay's) address.
"""

from __future__ import annotations

import itertools
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kipside.protocol.primitives import read_uvarint
from kipside.protocol.records import iter_batches

from .raw_batches import fetch_partition


class LogRecord(NamedTuple):
    offset: int
    producer_id: int
    transactional: bool
    control: int | None  # control batches: 0 abort marker, 1 commit marker
    key: bytes | None
    value: bytes | None


@dataclass
class ResolvedLog:
    """One partition's log resolved as read_committed is specified (markers per producer)."""

    committed: list[bytes] = field(default_factory=list)
    aborted: list[bytes] = field(default_factory=list)
    still_open: list[bytes] = field(default_factory=list)
    commit_markers: int = 0
    abort_markers: int = 0


def _svarint(buf: memoryview, pos: int) -> tuple[int, int]:
    raw, pos = read_uvarint(buf, pos)
    return (raw >> 1) ^ -(raw & 1), pos


def _records(batch: Any) -> Iterator[LogRecord]:
    assert batch.compression == 0, "the tests produce uncompressed batches"
    buf = batch.records
    pos = 0
    for _ in range(batch.records_count):
        length, pos = _svarint(buf, pos)
        end = pos + length
        pos += 1  # attributes
        _ts, pos = _svarint(buf, pos)
        delta, pos = _svarint(buf, pos)
        fields: list[bytes | None] = []
        for _field in ("key", "value"):
            size, pos = _svarint(buf, pos)
            fields.append(None if size < 0 else bytes(buf[pos : pos + size]))
            pos += max(size, 0)
        pos = end  # headers are not needed
        key, value = fields
        control = None
        if batch.is_control:
            assert key is not None and len(key) >= 4, key
            control = struct.unpack(">h", key[2:4])[0]
        yield LogRecord(
            batch.base_offset + delta,
            batch.producer_id,
            batch.is_transactional,
            control,
            key,
            value,
        )


def read_log(bootstrap: str, topic: str, partition: int, timeout: float = 30.0) -> list[LogRecord]:
    """Every record of one partition, control records included: Fetch v4, read_uncommitted,
    over a plain socket, from offset 0 to the high watermark."""
    host, port = bootstrap.rsplit(":", 1)
    out: list[LogRecord] = []
    offset = 0
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for correlation_id in itertools.count(1):
            assert time.monotonic() < deadline, f"{topic}[{partition}]: log not read in time"
            data = fetch_partition(sock, topic, partition, offset, correlation_id)
            for batch in iter_batches(data.records, allow_partial_tail=True):
                out.extend(r for r in _records(batch) if r.offset >= offset)
                offset = max(offset, batch.base_offset + batch.last_offset_delta + 1)
            if offset >= data.high_watermark:
                return out
    raise AssertionError("unreachable")


def resolve(records: list[LogRecord]) -> ResolvedLog:
    out = ResolvedLog()
    pending: dict[int, list[bytes]] = {}
    for r in sorted(records, key=lambda r: r.offset):
        if r.control is not None:
            batch = pending.pop(r.producer_id, [])
            if r.control == 1:
                out.commit_markers += 1
                out.committed.extend(batch)
            else:
                out.abort_markers += 1
                out.aborted.extend(batch)
        elif r.transactional:
            pending.setdefault(r.producer_id, []).append(r.value or b"")
        else:
            out.committed.append(r.value or b"")
    for values in pending.values():
        out.still_open.extend(values)
    return out
