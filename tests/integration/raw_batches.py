"""The record batches a partition stores, read over a plain socket with kipside's own codec.

Client APIs hide how records were stored: the batches, their compression and their producer
fields. These helpers send one Fetch (read_uncommitted) and read the batch headers of its answer,
so a test can check what a client (through kipside or directly) actually wrote. `read_frame` also
serves the tests that speak the protocol by hand over a blocking socket.
"""

from __future__ import annotations

import socket
import struct
from typing import NamedTuple

from kipside.protocol import (
    ApiKey,
    FetchPartition,
    PartitionData,
    build_frame,
    encode_fetch_request,
    encode_request_header,
    iter_batches,
    parse_fetch_response,
    parse_response_header,
)

RAW_FETCH_BYTES = 16 << 20
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


class BatchInfo(NamedTuple):
    """The header of one stored record batch (magic v2), as a Fetch returns it."""

    base_offset: int
    records: int
    compression: int  # attributes bits 0-2: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd
    transactional: bool
    control: bool
    producer_id: int
    producer_epoch: int
    base_sequence: int


def fetch_partition(
    sock: socket.socket, topic: str, partition: int, offset: int, correlation_id: int
) -> PartitionData:
    """One Fetch v4 (read_uncommitted) of one partition from `offset` on a plain socket: what
    the broker stored, which client APIs hide. Written and read by kipside's own codec."""
    fetch = FetchPartition(topic, partition, offset, RAW_FETCH_BYTES)
    body = encode_fetch_request(
        4, [fetch], max_wait_ms=100, min_bytes=1, max_bytes=RAW_FETCH_BYTES, isolation_level=0
    )
    header = encode_request_header(ApiKey.FETCH, 4, correlation_id, "kipside-it-raw")
    sock.sendall(build_frame(header, body))
    frame = read_frame(sock)
    answer = parse_response_header(frame, ApiKey.FETCH, 4)
    assert answer.correlation_id == correlation_id, (answer.correlation_id, correlation_id)
    (data,) = parse_fetch_response(frame, answer.body_offset, 4).partitions
    assert data.error_code == 0, f"Fetch error {data.error_code} for {topic}[{partition}]"
    return data


def raw_fetch_batches(
    bootstrap: str, topic: str, partition: int, timeout: float = 5.0
) -> list[BatchInfo]:
    """The headers of the batches stored in one partition from offset 0 (one Fetch)."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        records = fetch_partition(sock, topic, partition, 0, 7).records
    return [
        BatchInfo(
            b.base_offset,
            b.records_count,
            int(b.compression),
            b.is_transactional,
            b.is_control,
            b.producer_id,
            b.producer_epoch,
            b.base_sequence,
        )
        for b in iter_batches(records, allow_partial_tail=True)
    ]


def read_frame(sock: socket.socket) -> bytes:
    """One whole frame, its size prefix included, from a blocking socket."""
    head = _recv_exact(sock, 4)
    return head + _recv_exact(sock, struct.unpack(">i", head)[0])


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf
