"""The TCP segment inside one captured packet: link layer, IPv4 or IPv6, TCP, read with struct.

A summary reads every packet of captures of a gigabyte or more, so this is the one place that
touches each packet, with plain struct reads (dissecting every packet with scapy's layers would
cost tens of microseconds each). What is not a TCP segment comes back as the reason it was
skipped, one of SKIP_REASONS. This module never reads files (capture.py does) and never looks
at the bytes a segment carries (reassembly.py and frames.py do).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

__all__ = ["LINK_TYPES", "SKIP_REASONS", "Segment", "tcp_segment"]

# Link types (https://www.tcpdump.org/linktypes.html) and where the IP header starts.
LINKTYPE_NULL: Final = 0  # BSD loopback: 4-byte address family, host byte order
LINKTYPE_ETHERNET: Final = 1  # tcpdump -i lo on Linux
LINKTYPE_RAW: Final = 101  # raw IP (also 12 and 14 on some systems)
LINKTYPE_LOOP: Final = 108  # OpenBSD loopback: address family in network byte order
LINKTYPE_LINUX_SLL: Final = 113  # tcpdump -i any (libpcap < 1.10)
LINKTYPE_LINUX_SLL2: Final = 276  # tcpdump -i any (libpcap >= 1.10)
LINKTYPE_IPV4: Final = 228
LINKTYPE_IPV6: Final = 229
LINK_TYPES: Final = {
    LINKTYPE_NULL: "BSD loopback",
    LINKTYPE_ETHERNET: "Ethernet",
    LINKTYPE_RAW: "raw IP",
    12: "raw IP",
    14: "raw IP",
    LINKTYPE_LOOP: "OpenBSD loopback",
    LINKTYPE_LINUX_SLL: "Linux cooked (SLL)",
    LINKTYPE_LINUX_SLL2: "Linux cooked (SLL2)",
    LINKTYPE_IPV4: "IPv4",
    LINKTYPE_IPV6: "IPv6",
}

NOT_IP: Final = "not IP"
NOT_TCP: Final = "not TCP"
FRAGMENT: Final = "IP fragments"
HEADERS_CUT: Final = "headers cut by the snap length"
BAD_HEADER: Final = "malformed IP or TCP headers"
UNKNOWN_LINK: Final = "unknown link type"
SKIP_REASONS: Final = (NOT_IP, NOT_TCP, FRAGMENT, HEADERS_CUT, BAD_HEADER, UNKNOWN_LINK)

ETHERTYPE_IPV4: Final = 0x0800
ETHERTYPE_IPV6: Final = 0x86DD
_VLAN_TAGS: Final = frozenset({0x8100, 0x88A8, 0x9100})
_BSD_AF_INET6: Final = frozenset({24, 28, 30})  # AF_INET6 on NetBSD/OpenBSD, FreeBSD, macOS
_U16: Final = struct.Struct(">H")
_U16_LE: Final = struct.Struct("<H")
_AF_HOST: Final = struct.Struct("=I")
_AF_NET: Final = struct.Struct(">I")
# source port, destination port, sequence, acknowledgment, data offset, flags
_TCP: Final = struct.Struct(">HHIIBB")
_IPV6_EXTENSIONS: Final = frozenset({0, 43, 60})  # hop-by-hop, routing, destination options
_IPV6_FRAGMENT: Final = 44
IPPROTO_TCP: Final = 6

FIN: Final = 0x01
SYN: Final = 0x02
RST: Final = 0x04
ACK: Final = 0x10


@dataclass(slots=True, eq=False)
class Segment:
    """One TCP segment: addresses, sequence number, flags and the payload the capture holds.

    `missing` is how many payload bytes the packet carried on the wire beyond what the capture
    kept (a snap length shorter than the packet).
    """

    src: bytes
    sport: int
    dst: bytes
    dport: int
    seq: int
    ack: int
    flags: int
    payload: memoryview
    missing: int


def _ip_offset(linktype: int, data: bytes) -> int | str:
    """Where the IP header starts in a packet of this link type, or why there is none."""
    if linktype == LINKTYPE_ETHERNET:
        if len(data) < 14:
            return HEADERS_CUT
        offset = 12
        ethertype = _U16.unpack_from(data, offset)[0]
        while ethertype in _VLAN_TAGS:
            offset += 4
            if len(data) < offset + 2:
                return HEADERS_CUT
            ethertype = _U16.unpack_from(data, offset)[0]
        if ethertype not in (ETHERTYPE_IPV4, ETHERTYPE_IPV6):
            return NOT_IP
        return offset + 2
    if linktype in (LINKTYPE_RAW, 12, 14, LINKTYPE_IPV4, LINKTYPE_IPV6):
        return 0
    if linktype == LINKTYPE_LINUX_SLL:
        if len(data) < 16:
            return HEADERS_CUT
        return 16 if _U16.unpack_from(data, 14)[0] in (ETHERTYPE_IPV4, ETHERTYPE_IPV6) else NOT_IP
    if linktype == LINKTYPE_LINUX_SLL2:
        if len(data) < 20:
            return HEADERS_CUT
        return 20 if _U16.unpack_from(data, 0)[0] in (ETHERTYPE_IPV4, ETHERTYPE_IPV6) else NOT_IP
    if linktype in (LINKTYPE_NULL, LINKTYPE_LOOP):
        if len(data) < 4:
            return HEADERS_CUT
        family = (_AF_HOST if linktype == LINKTYPE_NULL else _AF_NET).unpack_from(data, 0)[0]
        if family != 2 and family not in _BSD_AF_INET6:
            # A capture written on a host of the other byte order.
            family = _U16_LE.unpack_from(data, 0)[0] or _U16.unpack_from(data, 2)[0]
        return 4 if family == 2 or family in _BSD_AF_INET6 else NOT_IP
    return UNKNOWN_LINK


def tcp_segment(linktype: int, data: bytes, wirelen: int) -> Segment | str:
    """The TCP segment in a captured packet, or the reason (one of SKIP_REASONS) it has none.

    `wirelen` is the packet's length on the wire; the payload bytes the capture lacks are
    `Segment.missing`.
    """
    ip = _ip_offset(linktype, data)
    if isinstance(ip, str):
        return ip
    size = len(data)
    if size < ip + 20:
        return HEADERS_CUT
    version = data[ip] >> 4
    if version == 4:
        found = _ipv4(data, ip, wirelen)
    elif version == 6:
        found = _ipv6(data, ip, wirelen)
    else:
        return NOT_IP
    if isinstance(found, str):
        return found
    src, dst, tcp, end = found
    if size < tcp + 20:
        return HEADERS_CUT
    sport, dport, seq, ack, offset_byte, flags = _TCP.unpack_from(data, tcp)
    start = tcp + (offset_byte >> 4) * 4
    if start < tcp + 20 or start > end:
        return BAD_HEADER
    if size < start:
        return HEADERS_CUT
    captured_end = min(end, size)
    # What the wire carried beyond what the capture kept (never more than the IP length says).
    missing = max(0, min(end, wirelen) - captured_end)
    return Segment(
        src,
        sport,
        dst,
        dport,
        seq,
        ack,
        flags,
        memoryview(data)[start:captured_end],
        missing,
    )


_IpPart = tuple[bytes, bytes, int, int]
"""An IP header's source and destination addresses, where its TCP header starts, and where
the IP packet ends (by its own length)."""


def _ipv4(data: bytes, ip: int, wirelen: int) -> _IpPart | str:
    ihl = (data[ip] & 0x0F) * 4
    if ihl < 20:
        return BAD_HEADER
    if data[ip + 9] != IPPROTO_TCP:
        return NOT_TCP
    if _U16.unpack_from(data, ip + 6)[0] & 0x3FFF:  # more fragments, or a fragment offset
        return FRAGMENT
    total = _U16.unpack_from(data, ip + 2)[0]
    # 0: a segment larger than 64 KiB handed over by TSO/GSO; its length is the packet's.
    end = ip + total if total else wirelen
    return data[ip + 12 : ip + 16], data[ip + 16 : ip + 20], ip + ihl, end


def _ipv6(data: bytes, ip: int, wirelen: int) -> _IpPart | str:
    size = len(data)
    if size < ip + 40:
        return HEADERS_CUT
    payload_length = _U16.unpack_from(data, ip + 4)[0]
    next_header = data[ip + 6]
    tcp = ip + 40
    while next_header in _IPV6_EXTENSIONS:
        if size < tcp + 8:
            return HEADERS_CUT
        next_header, tcp = data[tcp], tcp + 8 + data[tcp + 1] * 8
    if next_header == _IPV6_FRAGMENT:
        return FRAGMENT
    if next_header != IPPROTO_TCP:
        return NOT_TCP
    # 0: a jumbogram (BIG TCP) whose length is the packet's.
    end = ip + 40 + payload_length if payload_length else wirelen
    return data[ip + 8 : ip + 24], data[ip + 24 : ip + 40], tcp, end
