"""Capture files made and damaged on purpose, for the tests of `kipside pcap`.

- `conversation(exchanges)`: one TCP connection carrying the given request and response frames,
  as scapy packets (Ether/IP/TCP: handshake, data segments of at most `mss` bytes, FIN), so a
  test controls every byte and segment boundary.
- `write_pcap` / `read_pcap` (`file_header`, `record_bytes`): the pcap format itself (records of
  timestamp, captured length, length on the wire, bytes), so a test can write what tcpdump would:
  packets cut by a snap length, a file cut mid-record (and bench/pcap_summary.py a 1 GB capture).
- `dropped`, `duplicated`, `swapped`, `snapped`, `cut`: damaged copies of a capture's records.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

_GLOBAL = struct.Struct("<IHHiIII")
_RECORD = struct.Struct("<IIII")
LINKTYPE_ETHERNET = 1


@dataclass(frozen=True)
class Record:
    ts: float
    data: bytes
    wirelen: int


def read_pcap(path: Path) -> list[Record]:
    raw = path.read_bytes()
    magic = raw[:4]
    assert magic == b"\xd4\xc3\xb2\xa1", f"{path}: not a little-endian microsecond pcap"
    out, pos = [], _GLOBAL.size
    while pos + _RECORD.size <= len(raw):
        sec, usec, caplen, wirelen = _RECORD.unpack_from(raw, pos)
        pos += _RECORD.size
        out.append(Record(sec + usec / 1e6, raw[pos : pos + caplen], wirelen))
        pos += caplen
    return out


def file_header(snaplen: int = 262144) -> bytes:
    """The header of a pcap file of Ethernet packets, as `tcpdump -i lo` writes it."""
    return _GLOBAL.pack(0xA1B2C3D4, 2, 4, 0, 0, snaplen, LINKTYPE_ETHERNET)


def record_bytes(ts: float, data: bytes, wirelen: int) -> bytes:
    """One packet's record: timestamp (microseconds), captured length, length on the wire, bytes."""
    sec = int(ts)
    carry, usec = divmod(round((ts - sec) * 1e6), 1_000_000)
    return _RECORD.pack(sec + carry, usec, len(data), wirelen) + data


def pcap_bytes(records: Sequence[Record], snaplen: int = 262144) -> bytes:
    return file_header(snaplen) + b"".join(record_bytes(r.ts, r.data, r.wirelen) for r in records)


def write_pcap(path: Path, records: Sequence[Record]) -> Path:
    path.write_bytes(pcap_bytes(records))
    return path


def from_packets(packets: Sequence[Any], start: float = 1_700_000_000.0) -> list[Record]:
    """Records of scapy packets, 100 microseconds apart."""
    return [Record(start + i * 1e-4, bytes(p), len(bytes(p))) for i, p in enumerate(packets)]


def conversation(
    exchanges: Sequence[tuple[bytes, bytes | None]],
    *,
    client: tuple[str, int] = ("10.0.0.1", 40000),
    server: tuple[str, int] = ("10.0.0.2", 9092),
    mss: int = 1000,
    handshake: bool = True,
    client_isn: int = 1000,
    server_isn: int = 5000,
    server_closes_first: bool = False,
) -> list[Any]:
    """One TCP connection: each request frame, then its response frame (None: no answer); then
    the client closes it (FIN), or the server first."""
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether

    def segment(
        src: tuple[str, int],
        dst: tuple[str, int],
        seq: int,
        ack: int,
        flags: str,
        payload: bytes = b"",
    ) -> Any:
        packet = (
            Ether()
            / IP(src=src[0], dst=dst[0])
            / TCP(sport=src[1], dport=dst[1], seq=seq, ack=ack, flags=flags)
        )
        return packet / payload if payload else packet

    packets = []
    c_seq, s_seq = client_isn + 1, server_isn + 1
    if handshake:
        packets.append(segment(client, server, client_isn, 0, "S"))
        packets.append(segment(server, client, server_isn, c_seq, "SA"))
        packets.append(segment(client, server, c_seq, s_seq, "A"))
    for request, response in exchanges:
        for at in range(0, len(request), mss):
            chunk = request[at : at + mss]
            packets.append(segment(client, server, c_seq, s_seq, "PA", chunk))
            c_seq += len(chunk)
        packets.append(segment(server, client, s_seq, c_seq, "A"))
        if response is not None:
            for at in range(0, len(response), mss):
                chunk = response[at : at + mss]
                packets.append(segment(server, client, s_seq, c_seq, "PA", chunk))
                s_seq += len(chunk)
            packets.append(segment(client, server, c_seq, s_seq, "A"))
    if server_closes_first:
        packets.append(segment(server, client, s_seq, c_seq, "FA"))
        packets.append(segment(client, server, c_seq, s_seq + 1, "FA"))
        packets.append(segment(server, client, s_seq + 1, c_seq + 1, "A"))
    else:
        packets.append(segment(client, server, c_seq, s_seq, "FA"))
        packets.append(segment(server, client, s_seq, c_seq + 1, "FA"))
        packets.append(segment(client, server, c_seq + 1, s_seq + 1, "A"))
    return packets


def payload_length(record: Record) -> int:
    """Bytes of TCP payload in an Ethernet/IPv4 record (0 for anything else)."""
    data = record.data
    if len(data) < 34 or data[12:14] != b"\x08\x00":
        return 0
    ihl = (data[14] & 0x0F) * 4
    total = int.from_bytes(data[16:18], "big")
    tcp = 14 + ihl
    return total - ihl - (data[tcp + 12] >> 4) * 4


def dropped(records: Sequence[Record], index: int) -> list[Record]:
    return [r for i, r in enumerate(records) if i != index]


def duplicated(records: Sequence[Record], indexes: Sequence[int]) -> list[Record]:
    """Each given packet captured twice in a row (a retransmission)."""
    out: list[Record] = []
    for i, r in enumerate(records):
        out.append(r)
        if i in indexes:
            out.append(replace(r, ts=r.ts + 5e-5))
    return out


def swapped(records: Sequence[Record], index: int) -> list[Record]:
    """Packets index and index + 1 in each other's place (out of order)."""
    out = list(records)
    out[index], out[index + 1] = out[index + 1], out[index]
    return out


def snapped(records: Sequence[Record], index: int, keep: int) -> list[Record]:
    """Packet `index` captured with only its first `keep` bytes (a short snap length)."""
    out = list(records)
    out[index] = replace(out[index], data=out[index].data[:keep])
    return out


def cut(data: bytes, drop: int) -> bytes:
    """A capture file without its last `drop` bytes."""
    return data[:-drop]
